// Package deploytest holds no code, only tests: they check the Docker
// and Kubernetes deployments (docker-compose.yml, Dockerfile, deploy/)
// against the service's code without a Docker engine or a cluster, so that `go test ./...` catches a compose
// file that names a variable config no longer reads, an address of a server
// that is not in the stack, a dashboard panel querying a metric nobody
// registers, or an image build that is no longer static.
//
// The compose file is loaded with compose-go, the loader docker compose
// itself uses: "it loads here" means docker compose would accept it.
package deploytest
