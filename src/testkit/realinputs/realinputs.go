// Package realinputs holds what real BOSH callers send a CPI, written from
// the callers' own source (each shape names the repository and path it
// was read from; docs/testing.md lists them). The drivers' tests feed them
// through bin/cpi against the dev cloud, the EC2 server and the local
// driver: every one must be accepted. The values are ours; the keys,
// types and nesting are the callers'.
package realinputs

// HeavyStemcell is stemcell.MF's cloud_properties for infrastructure
// (openstack, aws, warden): cloudfoundry/bosh-linux-stemcell-builder,
// bosh-stemcell/lib/bosh/stemcell/stemcell_packager.rb (manifest_cloud_properties:
// name, version as a string, infrastructure, hypervisor, disk in MiB,
// disk_format, container_format, os_type, os_distro, architecture) merged
// with infrastructure.rb's additional_cloud_properties (auto_disk_config
// for OpenStack, root_device_name for the others).
func HeavyStemcell(infrastructure, diskFormat string) map[string]any {
	hypervisor := map[string]string{"openstack": "kvm", "aws": "xen", "warden": "boshlite"}[infrastructure]
	p := map[string]any{
		"name":             "bosh-" + infrastructure + "-" + hypervisor + "-ubuntu-noble",
		"version":          "1.484",
		"infrastructure":   infrastructure,
		"hypervisor":       hypervisor,
		"disk":             5120,
		"disk_format":      diskFormat,
		"container_format": "bare",
		"os_type":          "linux",
		"os_distro":        "ubuntu",
		"architecture":     "x86_64",
	}
	if infrastructure == "openstack" {
		p["auto_disk_config"] = true
	} else {
		p["root_device_name"] = "/dev/sda1"
	}
	return p
}

// AWSLightStemcell is a bosh.io light stemcell's cloud_properties:
// cloudfoundry/bosh-aws-light-stemcell-builder, manifest/manifest.go
// (CloudProperties: infrastructure and ami, a region → AMI map; nothing of
// the heavy stemcell's keys is kept).
func AWSLightStemcell(region, ami string) map[string]any {
	return map[string]any{"infrastructure": "aws", "ami": map[string]any{region: ami}}
}

// ManualNetwork is a manual network's settings as the Director sends them:
// cloudfoundry/bosh, src/bosh-director/lib/bosh/director/deployment_plan/manual_network.rb
// (network_settings: type, ip, prefix as a string, netmask, cloud_properties,
// default, nic_group as a string when the manifest sets one, dns, gateway).
func ManualNetwork(ip, netmask, gateway string, cloudProps map[string]any, nicGroup string) map[string]any {
	n := map[string]any{"type": "manual", "ip": ip, "prefix": "32", "netmask": netmask, "gateway": gateway,
		"dns": []any{"8.8.8.8"}, "default": []any{"dns", "gateway"}, "cloud_properties": cloudProps}
	if nicGroup != "" {
		n["nic_group"] = nicGroup
	}
	return n
}

// DynamicNetwork: the same file's dynamic_network.rb (type, cloud_properties,
// prefix "32" by default, dns, default).
func DynamicNetwork(cloudProps map[string]any) map[string]any {
	return map[string]any{"type": "dynamic", "cloud_properties": cloudProps, "prefix": "32",
		"dns": []any{"8.8.8.8"}, "default": []any{"dns", "gateway"}}
}

// VIPNetwork: vip_network.rb (type, ip, cloud_properties, prefix).
func VIPNetwork(ip string, cloudProps map[string]any) map[string]any {
	return map[string]any{"type": "vip", "ip": ip, "cloud_properties": cloudProps, "prefix": "32"}
}

// BootstrapNetwork is a manual network as bosh-cli's create-env sends it:
// cloudfoundry/bosh-cli, deployment/manifest/network.go (Interface: type,
// gateway, dns, netmask, cloud_properties, ip, default; no prefix).
func BootstrapNetwork(ip, netmask, gateway string, cloudProps map[string]any) map[string]any {
	return map[string]any{"type": "manual", "ip": ip, "netmask": netmask, "gateway": gateway,
		"dns": []any{"8.8.8.8"}, "default": []any{"dns", "gateway"}, "cloud_properties": cloudProps}
}

// DirectorEnv is create_vm's environment from the Director:
// cloudfoundry/bosh, src/bosh-director/lib/bosh/director/deployment_plan/steps/create_vm_step.rb
// (Config.agent_env — bosh-deployment's bosh.yml agent.env.bosh: blobstores
// with the agent's credentials, ntp — merged under the manifest's env.bosh,
// then tags, mbus.cert (ca, certificate, private_key), a hashed password,
// group and groups).
func DirectorEnv(agentID string) map[string]any {
	return map[string]any{"bosh": map[string]any{
		"blobstores": []any{map[string]any{"provider": "dav", "options": map[string]any{
			"endpoint": "https://10.0.0.6:25250", "user": "agent", "password": "agent-blobstore-password",
			"tls": map[string]any{"cert": map[string]any{"ca": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"}}}}},
		"ntp":  []any{"time1.google.com", "time2.google.com"},
		"tags": map[string]any{"team": "real-inputs"},
		"mbus": map[string]any{"cert": map[string]any{"ca": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
			"certificate": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n",
			"private_key": "-----BEGIN RSA PRIVATE KEY-----\nagent-" + agentID + "\n-----END RSA PRIVATE KEY-----\n"}},
		"password":                "$6$4gDD3aV0rdqlrKC$2axHCxGKIObs6tAmMTqYCspcdvQXh3JJcvWOY2WGb4SrdXtnCyNaWlrf3WEqvYR2MYizEGp3kMmbpwBC6jsHt0",
		"group":                   "my-director-cf-router",
		"groups":                  []any{"my-director", "cf", "router", "my-director-cf", "cf-router", "my-director-cf-router"},
		"remove_dev_tools":        true,
		"remove_static_libraries": true,
		"keep_root_password":      false,
	}}
}

// BootstrapEnv is bosh-deployment's bosh.yml resource_pools env, which
// bosh-cli's create-env sends verbatim: a local blobstore, the mbus cert,
// ntp, password "*".
func BootstrapEnv() map[string]any {
	return map[string]any{"bosh": map[string]any{
		"blobstores": []any{map[string]any{"provider": "local", "options": map[string]any{"blobstore_path": "/var/vcap/micro_bosh/data/cache"}}},
		"mbus":       map[string]any{"cert": map[string]any{"ca": "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"}},
		"ntp":        []any{"time1.google.com"},
		"password":   "*",
	}}
}

// DirectorContext is every request's context from the Director:
// cloudfoundry/bosh, src/bosh-director/lib/bosh/director/cloud/external_cpi.rb
// (director_uuid, request_id "cpi-NNNNNN", vm.stemcell.api_version) with a
// cpi-config's properties merged in flat (extra).
func DirectorContext(directorUUID string, stemcellAPI int, extra map[string]any) map[string]any {
	ctx := map[string]any{"director_uuid": directorUUID, "request_id": "cpi-458213",
		"vm": map[string]any{"stemcell": map[string]any{"api_version": stemcellAPI}}}
	for k, v := range extra {
		ctx[k] = v
	}
	return ctx
}

// OpenStackCPIConfig is a cpi-config entry's properties as
// cloudfoundry/bosh-deployment's openstack/cpi-secondary.yml and cpi.yml
// name them (the official openstack_cpi job's properties).
func OpenStackCPIConfig(authURL, user, password, project, region string) map[string]any {
	return map[string]any{"auth_url": authURL, "username": user, "api_key": password, "project": project,
		"domain": "Default", "region": region, "default_key_name": "", "default_security_groups": []any{"default"},
		"human_readable_vm_names": true}
}

// OpenStackVMType is cloudfoundry/bosh-deployment's openstack/cloud-config.yml
// vm_types cloud_properties merged with its azs' (instance_type,
// availability_zone).
func OpenStackVMType(instanceType, az string) map[string]any {
	return map[string]any{"instance_type": instanceType, "availability_zone": az}
}

// AWSVMType is aws/cloud-config.yml's vm_types cloud_properties with its
// azs' (instance_type, ephemeral_disk.size in MiB, availability_zone) —
// and aws/cpi.yml's resource pool adds ephemeral_disk.type.
func AWSVMType(instanceType, az string) map[string]any {
	return map[string]any{"instance_type": instanceType, "availability_zone": az,
		"ephemeral_disk": map[string]any{"size": 25000, "type": "gp3"}}
}

// AWSDiskType is aws/cpi.yml's disk pool cloud_properties.
func AWSDiskType() map[string]any { return map[string]any{"type": "gp3"} }
