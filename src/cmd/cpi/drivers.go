package main

import (
	"encoding/json"

	"github.com/runway-cpi/runway/src/cpi"
	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/aws"
	"github.com/runway-cpi/runway/src/driver/local"
	"github.com/runway-cpi/runway/src/driver/openstack"
)

// drivers built into bin/cpi, by config name.
var drivers = map[string]cpi.Factory{
	"local": func(section json.RawMessage, deps cpi.Deps) (driver.Driver, error) {
		return local.New(section, deps.StateDir, deps.Locker, deps.Logger)
	},
	"openstack": func(section json.RawMessage, deps cpi.Deps) (driver.Driver, error) {
		return openstack.New(section, deps.StateDir, deps.Locker, deps.Logger, deps.Retry, deps.Redact)
	},
	"aws": func(section json.RawMessage, deps cpi.Deps) (driver.Driver, error) {
		return aws.New(section, deps.Locker, deps.Logger, deps.Retry, deps.Redact)
	},
}
