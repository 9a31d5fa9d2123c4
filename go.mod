module github.com/runway-cpi/runway

go 1.26.8

require (
	github.com/cloudfoundry/bosh-utils v0.0.560
	github.com/gofrs/flock v0.13.1
)

require (
	github.com/nu7hatch/gouuid v0.0.0-20131221200532-179d4d0c4d8d // indirect
	github.com/onsi/ginkgo/v2 v2.34.0 // indirect
	github.com/onsi/gomega v1.44.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/sys v0.47.0 // indirect
	golang.org/x/tools v0.45.0 // indirect
)
