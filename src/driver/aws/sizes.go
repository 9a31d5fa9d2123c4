package aws

import (
	"context"

	"github.com/runway-cpi/runway/src/driver"
)

// instanceType is one row of the sizing table: current general-purpose,
// compute- and memory-optimised types, cheapest first within each size.
type instanceType struct {
	Name   string
	CPU    int
	RAMMiB int
}

// instanceTypes is ordered by on-demand price (us-east-1), so the first
// type that fits is the cheapest that fits.
var instanceTypes = []instanceType{
	{"t3.micro", 2, 1024},
	{"t3.small", 2, 2048},
	{"t3.medium", 2, 4096},
	{"m6i.large", 2, 8192},
	{"c6i.xlarge", 4, 8192},
	{"r6i.large", 2, 16384},
	{"m6i.xlarge", 4, 16384},
	{"c6i.2xlarge", 8, 16384},
	{"r6i.xlarge", 4, 32768},
	{"m6i.2xlarge", 8, 32768},
	{"c6i.4xlarge", 16, 32768},
	{"r6i.2xlarge", 8, 65536},
	{"m6i.4xlarge", 16, 65536},
	{"c6i.8xlarge", 32, 65536},
	{"r6i.4xlarge", 16, 131072},
	{"m6i.8xlarge", 32, 131072},
	{"c6i.16xlarge", 64, 131072},
	{"r6i.8xlarge", 32, 262144},
	{"m6i.16xlarge", 64, 262144},
	{"r6i.16xlarge", 64, 524288},
	{"m6i.32xlarge", 128, 524288},
	{"r6i.32xlarge", 128, 1048576},
}

// CalculateVMCloudProperties picks the cheapest type with enough CPUs and
// memory; the ephemeral disk becomes an EBS volume of the asked size.
func (d *Driver) CalculateVMCloudProperties(_ context.Context, r driver.Resources) (driver.Props, error) {
	if r.CPU < 0 || r.RAM < 0 || r.EphemeralDiskSize < 0 {
		return driver.Props{}, driver.Invalid("vm resources must not be negative: %+v", r)
	}
	for _, t := range instanceTypes {
		if t.CPU >= r.CPU && t.RAMMiB >= r.RAM {
			props := map[string]any{"instance_type": t.Name}
			if r.EphemeralDiskSize > 0 {
				props["ephemeral_disk"] = map[string]any{"size": r.EphemeralDiskSize, "type": "gp3"}
			}
			return driver.PropsOf(props), nil
		}
	}
	last := instanceTypes[len(instanceTypes)-1]
	return driver.Props{}, driver.Invalid("no instance type has %d CPUs and %d MiB (largest known: %s, %d CPUs, %d MiB)",
		r.CPU, r.RAM, last.Name, last.CPU, last.RAMMiB)
}
