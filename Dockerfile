# syntax=docker/dockerfile:1
#
# shop as a static binary on distroless: no shell, no libc, no package
# manager in the image, so nothing to patch but shop itself. The healthcheck
# is `shop healthcheck`, a sub-command, because there is no curl to call.
#
# internal/deploytest builds the binary with the flags of the `go build`
# line below and checks the result is static: keep that line one RUN.

ARG GO_VERSION=1.26.8

FROM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
# Modules first, in their own layer: a code change then reuses the download.
COPY go.mod go.sum ./
COPY third_party/ third_party/
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
# The build context has no .git (.dockerignore), so the version comes in
# as build arguments: make image (and make up) pass git describe's.
ARG VERSION=dev
ARG REVISION=
# CGO_ENABLED=0: the SQLite driver is pure Go, so nothing needs libc, and a
# static binary runs on an image that has none. -trimpath keeps build paths
# out of stack traces; -s -w drops the symbol table and DWARF (a third of
# the size; panics still print function names); -X stamps the version.
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 go build -trimpath -ldflags="-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" -o /out/shop ./cmd/shop

# distroless publishes no version tags, only digests: for a release, pin
# this line to the digest `docker buildx imagetools inspect` prints.
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/shop /shop
# nonroot (65532): the process needs no privilege; :8080 is above 1024.
USER nonroot:nonroot
EXPOSE 8080
HEALTHCHECK --interval=5s --timeout=3s --start-period=30s --retries=3 CMD ["/shop", "healthcheck"]
ENTRYPOINT ["/shop"]
CMD ["serve"]
