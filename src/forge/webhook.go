package forge

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
)

// Sign is the lowercase hex HMAC-SHA256 of body: Gitea's X-Gitea-Signature
// and GitHub's X-Hub-Signature-256 (after "sha256="), as a forge signs a
// delivery (the contract servers and tests sign with it; each client
// verifies with its library: Client.VerifyDelivery).
func Sign(secret, body []byte) string {
	m := hmac.New(sha256.New, secret)
	m.Write(body)
	return hex.EncodeToString(m.Sum(nil))
}

// WorkflowJobEvent is a `workflow_job` delivery, as both forges send it.
type WorkflowJobEvent struct {
	Action string `json:"action"`
	Job    Job    `json:"-"`
	Repo   string `json:"-"`
}

// ParseWorkflowJob decodes a `workflow_job` delivery body (Gitea and
// GitHub share the shape: action, workflow_job, repository).
func ParseWorkflowJob(body []byte) (WorkflowJobEvent, error) {
	var p struct {
		Action     string   `json:"action"`
		Job        *JobJSON `json:"workflow_job"`
		Repository struct {
			FullName string `json:"full_name"`
		} `json:"repository"`
	}
	if err := json.Unmarshal(body, &p); err != nil {
		return WorkflowJobEvent{}, fmt.Errorf("workflow_job payload: %v", err)
	}
	if p.Job == nil || p.Job.ID == 0 {
		return WorkflowJobEvent{}, errors.New("workflow_job payload: no workflow_job.id")
	}
	return WorkflowJobEvent{Action: p.Action, Repo: p.Repository.FullName, Job: p.Job.Job(p.Repository.FullName)}, nil
}
