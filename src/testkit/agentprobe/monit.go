package agentprobe

import (
	"encoding/xml"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strings"
)

// Monit sends monit's HTTP API the requests bosh-agent sends it, built as
// its client builds them (cloudfoundry/bosh-agent:
// jobsupervisor/monit/http_client.go, status.go; read for facts, the code
// is ours): `POST /<service>` with the body `action=start|stop|unmonitor`,
// basic auth and a form content type, no CSRF token, through a client
// that follows redirects as Go's default one does; `GET
// /_status2?format=xml` decoded into the fields the agent reads.
type Monit struct {
	Client         *http.Client // the agent uses http.DefaultClient (behind its retries)
	Host           string       // 127.0.0.1:2822 in a VM
	User, Password string       // from /var/vcap/monit/monit.user
}

// MonitService is one service of monit's status as the agent reads it.
type MonitService struct {
	Name    string `xml:"name,attr"`
	Status  int    `xml:"status"`
	Monitor int    `xml:"monitor"`
	Pending int    `xml:"pendingaction"`
}

// MonitStatus is monit's status as the agent reads it.
type MonitStatus struct {
	XMLName     xml.Name       `xml:"monit"`
	Incarnation string         `xml:"incarnation,attr"`
	Services    []MonitService `xml:"services>service"`
	Groups      []struct {
		Name     string   `xml:"name,attr"`
		Services []string `xml:"service"`
	} `xml:"servicegroups>servicegroup"`
}

// Service answers the named service and whether monit lists it.
func (s MonitStatus) Service(name string) (MonitService, bool) {
	for _, sv := range s.Services {
		if sv.Name == name {
			return sv, true
		}
	}
	return MonitService{}, false
}

// InGroup lists the services of group name (the agent's jobs: "vcap").
func (s MonitStatus) InGroup(name string) []string {
	for _, g := range s.Groups {
		if g.Name == name {
			return g.Services
		}
	}
	return nil
}

// Running is the agent's "running": monitored and status 0.
func (s MonitService) Running() bool { return s.Monitor == 1 && s.Status == 0 }

func (m Monit) Start(service string) error     { return m.action(service, "start") }
func (m Monit) Stop(service string) error      { return m.action(service, "stop") }
func (m Monit) Unmonitor(service string) error { return m.action(service, "unmonitor") }

func (m Monit) action(service, action string) error {
	resp, err := m.do("POST", m.url(service, ""), "action="+action)
	if err != nil {
		return err
	}
	resp.Body.Close()
	return nil
}

// Status is GET /_status2?format=xml, decoded.
func (m Monit) Status() (MonitStatus, error) {
	var st MonitStatus
	resp, err := m.do("GET", m.url("_status2", "format=xml"), "")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	d := xml.NewDecoder(resp.Body)
	d.CharsetReader = func(_ string, r io.Reader) (io.Reader, error) { return r, nil } // ISO-8859-1; names are ASCII
	if err := d.Decode(&st); err != nil {
		return st, fmt.Errorf("decoding monit's status: %w", err)
	}
	return st, nil
}

func (m Monit) url(thing, query string) string {
	u := url.URL{Scheme: "http", Host: m.Host, Path: path.Join("/", thing), RawQuery: query}
	return u.String()
}

// do is the agent's makeRequest and validateResponse: anything but 200 is
// an error carrying the status and body.
func (m Monit) do(method, target, body string) (*http.Response, error) {
	req, err := http.NewRequest(method, target, strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.SetBasicAuth(m.User, m.Password)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	resp, err := m.Client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return nil, fmt.Errorf("%s %s: %s: %s", method, target, resp.Status, b)
	}
	return resp, nil
}
