// Package garm is bin/cpi's second front door: garm's external-provider
// protocol (GARM_COMMAND). It maps every command onto CPI methods of the
// same cpi.Service the BOSH front door uses, so drivers, locks and hooks
// are shared and no IaaS operation is implemented twice.
package garm

import (
	"encoding/json"
	"fmt"
	"strings"

	"github.com/runway-cpi/runway/src/driver"
	"github.com/runway-cpi/runway/src/driver/catalog"
	"github.com/runway-cpi/runway/src/strict"
)

// Config is the optional "garm" section of a Runway CPI config.
type Config struct {
	// Images maps garm image names to stemcells and cloud properties.
	Images map[string]Image `json:"images,omitempty"`
	// Flavors maps garm flavors to cloud properties.
	Flavors map[string]props `json:"flavors,omitempty"`
	// CloudProperties are the base VM cloud properties.
	CloudProperties props `json:"cloud_properties,omitempty"`
	// Networks is the BOSH networks hash given to create_vm
	// (default: one dynamic network).
	Networks driver.Networks `json:"networks,omitempty"`
	// Stemcell is used when the image has no mapping. On the local driver
	// an empty built-in stemcell is made when this is unset too.
	Stemcell string `json:"stemcell,omitempty"`
}

// Image is one image mapping.
type Image struct {
	Stemcell        string `json:"stemcell"`
	CloudProperties props  `json:"cloud_properties,omitempty"`
}

// ExtraSpecs are the pool extra specs Runway understands.
type ExtraSpecs struct {
	Stemcell        string          `json:"stemcell,omitempty"`
	CloudProperties props           `json:"cloud_properties,omitempty"`
	Networks        driver.Networks `json:"networks,omitempty"`
	// UserData replaces the rendered runner install user data entirely.
	UserData string `json:"user_data,omitempty"`
}

func parseConfig(raw json.RawMessage) (*Config, error) {
	c := &Config{}
	if len(raw) > 0 && string(raw) != "null" {
		if err := strict.JSON("garm", raw, c); err != nil {
			return nil, err
		}
	}
	if len(c.Networks) == 0 {
		c.Networks = driver.Networks{"default": {Type: "dynamic"}}
	}
	return c, nil
}

func parseExtraSpecs(raw []byte) (*ExtraSpecs, error) {
	e := &ExtraSpecs{}
	if len(raw) == 0 || string(raw) == "null" || string(raw) == "{}" {
		return e, nil
	}
	if err := strict.JSON("extra specs", raw, e); err != nil {
		return nil, err
	}
	return e, nil
}

// ConfigSchema is the JSON schema of the garm section (GetConfigJSONSchema):
// the drivers and their sections come from the driver table.
var ConfigSchema = func() string {
	enum, _ := json.Marshal(catalog.Names())
	var sections strings.Builder
	for _, n := range catalog.Names() {
		fmt.Fprintf(&sections, "    %q: {\"type\": \"object\"},\n", n)
	}
	return strings.NewReplacer("DRIVERS", string(enum), "SECTIONS", sections.String()).Replace(schemaTemplate)
}()

// the provider config file is a whole Runway CPI config.
const schemaTemplate = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Runway CPI config used as a garm provider config",
  "type": "object",
  "required": ["driver", "state_dir"],
  "properties": {
    "driver": {"type": "string", "enum": DRIVERS},
    "state_dir": {"type": "string", "pattern": "^/"},
    "log_level": {"type": "string", "enum": ["debug", "info", "warn", "error", "none"]},
    "lock_timeout_seconds": {"type": "integer", "minimum": 1},
    "retry": {"type": "object"},
    "agent": {"type": "object"},
SECTIONS    "hooks": {"type": "object"},
    "garm": {
      "type": "object",
      "additionalProperties": false,
      "properties": {
        "images": {"type": "object", "additionalProperties": {
          "type": "object", "required": ["stemcell"], "additionalProperties": false,
          "properties": {"stemcell": {"type": "string"}, "cloud_properties": {"type": "object"}}}},
        "flavors": {"type": "object", "additionalProperties": {"type": "object"}},
        "cloud_properties": {"type": "object"},
        "networks": {"type": "object"},
        "stemcell": {"type": "string"}
      }
    }
  }
}`

// ExtraSpecsSchema is the JSON schema of pool extra specs.
const ExtraSpecsSchema = `{
  "$schema": "http://json-schema.org/draft-07/schema#",
  "title": "Runway pool extra specs",
  "type": "object",
  "additionalProperties": false,
  "properties": {
    "stemcell": {"type": "string", "description": "stemcell CID overriding the image mapping"},
    "cloud_properties": {"type": "object", "description": "driver cloud properties merged over the image's and flavor's"},
    "networks": {"type": "object", "description": "BOSH networks hash for the instance"},
    "user_data": {"type": "string", "description": "replaces the rendered runner install user data"}
  }
}`

// props are cloud properties in garm's section: merged (base, image,
// flavor, extra specs) before create_vm, which checks them.
type props map[string]any
