// Package e2e runs Runway on the dev cluster's real kubelet as an
// operator would: docs/kubernetes.md's install block, read from the doc
// and run as written (the image and the runner image built by
// scripts/image and pushed to the cluster's registry, the chart
// installed by the real helm), PostgreSQL (scripts/postgres-dev) behind a
// proxy on the cluster's link, seed 001's example and shapes and their
// Secrets applied unedited, the attacker's specs beside them, and the
// forge contract servers on the host's end of the link, which the
// controller and the runner pods reach. Its tests need scripts/k8s-dev
// and scripts/postgres-dev (src/testkit/testenv).
package e2e
