package main

// The drivers built into bin/cpi: each registers itself.
import (
	_ "github.com/runway-cpi/runway/src/driver/aws"
	_ "github.com/runway-cpi/runway/src/driver/local"
	_ "github.com/runway-cpi/runway/src/driver/openstack"
)
