module github.com/runway-cpi/runway

go 1.26.8

require (
	github.com/cloudbase/garm-provider-common v0.1.9
	github.com/cloudfoundry/bosh-utils v0.0.560
	github.com/gofrs/flock v0.13.1
	github.com/google/uuid v1.6.0
	github.com/onsi/ginkgo/v2 v2.34.0
	github.com/onsi/gomega v1.44.0
	golang.org/x/sys v0.47.0
)

require (
	github.com/Masterminds/semver/v3 v3.4.0 // indirect
	github.com/felixge/httpsnoop v1.0.4 // indirect
	github.com/go-logr/logr v1.4.3 // indirect
	github.com/go-task/slim-sprig/v3 v3.0.0 // indirect
	github.com/google/go-cmp v0.7.0 // indirect
	github.com/google/pprof v0.0.0-20260402051712-545e8a4df936 // indirect
	github.com/gorilla/handlers v1.5.2 // indirect
	github.com/mattn/go-isatty v0.0.20 // indirect
	github.com/minio/sio v0.4.3 // indirect
	github.com/pkg/errors v0.9.1 // indirect
	github.com/teris-io/shortid v0.0.0-20220617161101-71ec9f2aa569 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/crypto v0.53.0 // indirect
	golang.org/x/mod v0.36.0 // indirect
	golang.org/x/net v0.56.0 // indirect
	golang.org/x/sync v0.21.0 // indirect
	golang.org/x/text v0.38.0 // indirect
	golang.org/x/tools v0.45.0 // indirect
	gopkg.in/natefinch/lumberjack.v2 v2.2.1 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)
