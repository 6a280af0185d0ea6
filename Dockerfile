# syntax=docker/dockerfile:1
#
# One image with the four programs in /usr/local/bin; docker-compose.yml picks the
# program with `entrypoint`. The default entrypoint is payment-service.
#
#   docker build -t inbox-template/payment-service:dev .
#   docker run --rm --entrypoint /usr/local/bin/inboxctl inbox-template/payment-service:dev help
#
# Expected size: distroless static (~2 MB) plus the four static binaries, about
# 61 MB together with -s -w (payment-service 18.3, fake-gateway 17.7, inboxctl
# 16.6, order-publisher 8.5; measured with this build command), so ~63 MB.
# The runtime image has no shell and no curl: health checks run the programs'
# own `healthcheck` subcommand.

ARG GO_VERSION=1.26.8

# The build stage runs on the builder's platform and cross-compiles, so that a
# multi-platform build (--platform linux/amd64,linux/arm64) needs no emulation.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src

# Dependencies first: this layer only changes with go.mod and go.sum.
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download -x

COPY cmd/ cmd/
COPY internal/ internal/
ARG TARGETOS TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ \
      ./cmd/payment-service ./cmd/fake-gateway ./cmd/order-publisher ./cmd/inboxctl

FROM gcr.io/distroless/static-debian12:nonroot
LABEL org.opencontainers.image.title="payment-service" \
      org.opencontainers.image.description="RabbitMQ inbox payment-service template: payment-service, fake-gateway, order-publisher, inboxctl"
COPY --from=build /out/ /usr/local/bin/
USER nonroot:nonroot
# payment-service serves /healthz, /readyz and /metrics on 8080; fake-gateway on 8081.
EXPOSE 8080 8081
ENTRYPOINT ["/usr/local/bin/payment-service"]
