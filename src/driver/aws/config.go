package aws

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/credentials/stscreds"
	"github.com/aws/aws-sdk-go-v2/service/ebs"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"github.com/aws/aws-sdk-go-v2/service/sts"

	"github.com/runway-cpi/runway/src/config"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/poll"
)

// Config is the "aws" section of the CPI config.
type Config struct {
	Region string `json:"region"`
	// Endpoint overrides the EC2 (and EBS direct) endpoint: GovCloud,
	// EC2-compatible clouds, tests.
	Endpoint string `json:"endpoint,omitempty"`
	// CredentialsSource: "static" (the keys below) or "default" (env,
	// shared config, instance role). Default: static when keys are given.
	CredentialsSource string `json:"credentials_source,omitempty"`
	AccessKeyID       string `json:"access_key_id,omitempty"`
	SecretAccessKey   string `json:"secret_access_key,omitempty"`
	SessionToken      string `json:"session_token,omitempty"`
	// AssumeRoleARN: the driver works as this role (credentials above
	// are used to assume it).
	AssumeRoleARN        string `json:"assume_role_arn,omitempty"`
	AssumeRoleExternalID string `json:"assume_role_external_id,omitempty"`
	// STSEndpoint overrides where the role is assumed (AWS's regional STS
	// endpoint by default; endpoint above is EC2's, not STS's).
	STSEndpoint string `json:"sts_endpoint,omitempty"`

	DefaultKeyName            string   `json:"default_key_name,omitempty"`
	DefaultSecurityGroups     []string `json:"default_security_groups,omitempty"`
	DefaultIAMInstanceProfile string   `json:"default_iam_instance_profile,omitempty"`
	// DefaultAvailabilityZone places disks created without a VM.
	DefaultAvailabilityZone string `json:"default_availability_zone,omitempty"`

	// ELBEndpoint overrides the load-balancing endpoint (the official
	// aws.elb_endpoint; read for the load-balancer properties).
	ELBEndpoint string `json:"elb_endpoint,omitempty"`
	// CACert is a PEM bundle trusted in addition to the system's
	// (official: connection_options.ca_cert).
	CACert string `json:"ca_cert,omitempty"`
	// Encrypted and KMSKeyARN are the defaults for every volume the driver
	// makes (root, ephemeral, persistent) when cloud properties don't say.
	Encrypted bool   `json:"encrypted,omitempty"`
	KMSKeyARN string `json:"kms_key_arn,omitempty"`
	// MetadataOptions go into every RunInstances (the official CPI's
	// snake_case names of ModifyInstanceMetadataOptions).
	MetadataOptions *MetadataOptions `json:"metadata_options,omitempty"`
	// EnableDescribeInstanceTypes (default true): attach_disk asks EC2
	// whether the instance type's EBS is NVMe-only, to answer the NVMe
	// device path; false answers the device name.
	EnableDescribeInstanceTypes *bool `json:"enable_describe_instance_types,omitempty"`

	// MaxAttempts bounds the transient faults (5xx, resets, timeouts) one
	// API call sits out (default 8); throttles are waited out within the
	// CPI's retry budget.
	MaxAttempts int `json:"max_attempts,omitempty"`
	// poll_max_ms and wait_timeout_seconds.
	poll.Polling
	// RequestTimeoutSeconds bounds each HTTP request (default 60).
	RequestTimeoutSeconds int `json:"request_timeout_seconds,omitempty"`
}

// MetadataOptions is the instance metadata service's settings.
type MetadataOptions struct {
	HTTPEndpoint            string `json:"http_endpoint,omitempty"`
	HTTPTokens              string `json:"http_tokens,omitempty"`
	HTTPPutResponseHopLimit int32  `json:"http_put_response_hop_limit,omitempty"`
	HTTPProtocolIPv6        string `json:"http_protocol_ipv6,omitempty"`
	InstanceMetadataTags    string `json:"instance_metadata_tags,omitempty"`
}

func init() {
	// Every key is about the AWS account and its defaults: a cpi-config
	// may set each (docs/configuration.md, "Request context").
	driver.Register(driver.Registration{Section: config.Section{Name: "aws", Config: &Config{}, ContextKeys: contextKeys, Aliases: aliases},
		New: func(section json.RawMessage, deps driver.Deps) (driver.Driver, error) {
			return New(section, deps)
		},
	})
}

var contextKeys = []string{"region", "endpoint", "credentials_source", "access_key_id", "secret_access_key", "session_token",
	"assume_role_arn", "assume_role_external_id", "sts_endpoint", "default_key_name", "default_security_groups",
	"default_iam_instance_profile", "default_availability_zone", "elb_endpoint", "ca_cert", "encrypted", "kms_key_arn",
	"metadata_options", "enable_describe_instance_types", "max_attempts", "poll_max_ms", "wait_timeout_seconds",
	"request_timeout_seconds"}

// aliases are the official AWS CPI's job properties (aws.*), by their
// names and meanings (docs/aws.md has the table).
var aliases = []config.Alias{
	config.Rename("role_arn", "assume_role_arn"),
	// max_retries counts retries; max_attempts counts the first try too.
	config.Alias{Key: "max_retries", Apply: func(v any, set func(string, any)) error {
		n, ok := v.(float64)
		if !ok || n < 0 || n != float64(int(n)) {
			return fmt.Errorf("max_retries must be a whole number, not %v", v)
		}
		set("max_attempts", int(n)+1)
		return nil
	}},
	// ec2_endpoint is a host name without a scheme (https assumed).
	config.Alias{Key: "ec2_endpoint", Apply: func(v any, set func(string, any)) error {
		s, ok := v.(string)
		if !ok || s == "" {
			return fmt.Errorf("ec2_endpoint must be a host name")
		}
		if !strings.Contains(s, "://") {
			s = "https://" + s
		}
		set("endpoint", s)
		return nil
	}},
	config.Alias{Key: "connection_options", Apply: func(v any, set func(string, any)) error {
		m, ok := v.(map[string]any)
		if !ok {
			return fmt.Errorf("connection_options must be an object")
		}
		for k, x := range m {
			if k != "ca_cert" {
				return fmt.Errorf("connection_options.%s is not supported (the official CPI takes only ca_cert)", k)
			}
			if s, ok := x.(string); ok && s != "" {
				set("ca_cert", s)
			}
		}
		return nil
	}},
	config.Refuse("dualstack", "IPv6-only networking is not built yet", config.IsFalse),
	config.Refuse("stemcell", "stemcell.kernel_id is for paravirtual stemcells; HVM stemcells boot their own kernel", nil),
}

const (
	DefaultMaxAttempts    = 8
	DefaultRequestTimeout = time.Minute
	firstPoll             = 250 * time.Millisecond
)

func parseConfig(section json.RawMessage) (Config, error) {
	var c Config
	if err := driver.DecodeConfig("aws", section, &c); err != nil {
		return c, err
	}
	if c.Region == "" {
		return c, errors.New("aws: region is required")
	}
	if c.KMSKeyARN != "" && !c.Encrypted {
		return c, errors.New("aws: kms_key_arn needs encrypted: true (as the official CPI)")
	}
	if c.CACert != "" && !x509.NewCertPool().AppendCertsFromPEM([]byte(c.CACert)) {
		return c, errors.New("aws: ca_cert holds no PEM certificate")
	}
	// The official elb_endpoint is a host (or host:port), https assumed,
	// as ec2_endpoint is.
	if c.ELBEndpoint != "" && !strings.Contains(c.ELBEndpoint, "://") {
		c.ELBEndpoint = "https://" + c.ELBEndpoint
	}
	for key, ep := range map[string]string{"endpoint": c.Endpoint, "sts_endpoint": c.STSEndpoint, "elb_endpoint": c.ELBEndpoint} {
		if ep == "" {
			continue
		}
		u, err := url.Parse(ep)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			return c, fmt.Errorf("aws: %s %q must be an http(s) URL", key, ep)
		}
	}
	switch c.CredentialsSource {
	case "":
		c.CredentialsSource = "default"
		if c.AccessKeyID != "" || c.SecretAccessKey != "" {
			c.CredentialsSource = "static"
		}
	case "static", "default":
	case "env_or_profile": // the official name of default
		c.CredentialsSource = "default"
	default:
		return c, fmt.Errorf("aws: credentials_source %q: want static, env_or_profile or default", c.CredentialsSource)
	}
	if c.CredentialsSource == "static" && (c.AccessKeyID == "" || c.SecretAccessKey == "") {
		return c, errors.New("aws: credentials_source static needs access_key_id and secret_access_key")
	}
	for name, v := range map[string]int{"max_attempts": c.MaxAttempts, "poll_max_ms": c.PollMaxMilli,
		"wait_timeout_seconds": c.WaitTimeoutSeconds, "request_timeout_seconds": c.RequestTimeoutSeconds} {
		if v < 0 {
			return c, fmt.Errorf("aws: %s must not be negative", name)
		}
	}
	if c.MaxAttempts == 0 {
		c.MaxAttempts = DefaultMaxAttempts
	}
	return c, nil
}

// clients builds the SDK clients once per process, on first use (info and
// argument errors never pay for it).
func (d *Driver) clients(ctx context.Context) (*ec2.Client, *ebs.Client, error) {
	d.once.Do(func() { d.ec2, d.ebs, d.initErr = d.newClients(ctx) })
	return d.ec2, d.ebs, d.initErr
}

func (d *Driver) newClients(ctx context.Context) (*ec2.Client, *ebs.Client, error) {
	c := d.cfg
	reqTimeout := DefaultRequestTimeout
	if c.RequestTimeoutSeconds > 0 {
		reqTimeout = time.Duration(c.RequestTimeoutSeconds) * time.Second
	}
	opts := []func(*awsconfig.LoadOptions) error{
		awsconfig.WithRegion(c.Region),
		// A buildable client so AWS_CA_BUNDLE / shared-config CA bundles apply.
		awsconfig.WithHTTPClient(awshttp.NewBuildableClient().WithTimeout(reqTimeout)),
		// One retry owner per call: the CPI's policy (call, create).
		awsconfig.WithRetryer(func() aws.Retryer { return aws.NopRetryer{} }),
	}
	if c.CredentialsSource == "static" {
		opts = append(opts, awsconfig.WithCredentialsProvider(
			credentials.NewStaticCredentialsProvider(c.AccessKeyID, c.SecretAccessKey, c.SessionToken)))
	}
	if c.CACert != "" {
		opts = append(opts, awsconfig.WithCustomCABundle(strings.NewReader(c.CACert)))
	}
	cfg, err := awsconfig.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, nil, fmt.Errorf("aws: loading credentials: %w", err)
	}
	if c.AssumeRoleARN != "" {
		stsClient := sts.NewFromConfig(cfg, func(o *sts.Options) {
			if c.STSEndpoint != "" {
				o.BaseEndpoint = aws.String(strings.TrimRight(c.STSEndpoint, "/"))
			}
		})
		cfg.Credentials = aws.NewCredentialsCache(stscreds.NewAssumeRoleProvider(stsClient, c.AssumeRoleARN,
			func(o *stscreds.AssumeRoleOptions) {
				o.RoleSessionName = "runway-cpi"
				if c.AssumeRoleExternalID != "" {
					o.ExternalID = aws.String(c.AssumeRoleExternalID)
				}
			}))
	}
	d.awsCfg = cfg
	e := ec2.NewFromConfig(cfg, func(o *ec2.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(strings.TrimRight(c.Endpoint, "/"))
		}
	})
	b := ebs.NewFromConfig(cfg, func(o *ebs.Options) {
		if c.Endpoint != "" {
			o.BaseEndpoint = aws.String(strings.TrimRight(c.Endpoint, "/"))
		}
	})
	return e, b, nil
}
