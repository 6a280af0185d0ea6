# One build stage compiles the programs of cmd/; each image is a target of its own
# on distroless static, holding only its programs in /usr/local/bin:
#
#   target            programs                     expected size
#   fake-gateway      fake-gateway                 ~20.1 MB
#   fake-carrier      fake-carrier                 ~16 MB
#   shipping-service  shipping-service             ~20 MB
#   order-publisher   order-publisher              ~12.4 MB
#   payment-service   payment-service, inboxctl    ~39.1 MB  (the last stage: the default)
#
# Sizes: distroless static-debian12 (~2 MB) plus the static binaries, built with
# -s -w by the command below (measured: payment-service 18.9 MB, fake-gateway
# 18.1, order-publisher 10.4, inboxctl 18.2). Each image must stay under 40 MB;
# .ci/compose-check builds the binaries and checks the sum per target.
# inboxctl ships with payment-service: operators run it next to the service.
#
#   docker build -t inbox-template/payment-service:dev .
#   docker build --target fake-gateway -t inbox-template/fake-gateway:dev .
#   docker build --target order-publisher -t inbox-template/order-publisher:dev .
#   docker run --rm --entrypoint /usr/local/bin/inboxctl inbox-template/payment-service:dev help
#
# It needs BuildKit (the cache mounts, BUILDPLATFORM), and only the engine's
# built-in Dockerfile frontend: no `# syntax=` line, so that a build pulls
# nothing but the base images. Docker 23 and later build with BuildKit by
# default; on Engine 20.10 run `DOCKER_BUILDKIT=1 docker build ...`. Docker
# Compose builds with BuildKit on either.
#
# The runtime images have no shell and no curl: health checks run the programs'
# own `healthcheck` subcommand.

ARG GO_VERSION=1.26.8

# The build stage runs on the builder's platform and cross-compiles, so that a
# multi-platform build (--platform linux/amd64,linux/arm64) needs no emulation.
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src

# Dependencies first: this layer only changes with the go.mod and go.sum files
# (the kit is a module of its own, which go.mod replaces with ./kit).
COPY go.mod go.sum ./
COPY kit/go.mod kit/go.sum kit/
RUN --mount=type=cache,target=/go/pkg/mod \
    go mod download -x

COPY kit/ kit/
COPY cmd/ cmd/
COPY internal/ internal/
# The shipping example's package (its main is cmd/shipping-service).
COPY examples/ examples/
ARG TARGETOS TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags="-s -w" -o /out/ ./cmd/...
RUN mkdir -p /state/order-publisher

FROM gcr.io/distroless/static-debian12:nonroot AS fake-gateway
LABEL org.opencontainers.image.title="fake-gateway" \
      org.opencontainers.image.description="Fake payment gateway for the RabbitMQ inbox payment-service template"
COPY --from=build /out/fake-gateway /usr/local/bin/
USER nonroot:nonroot
# /v1/charges, /healthz and /metrics (and /faults when FAULTS_ENABLED).
EXPOSE 8081
ENTRYPOINT ["/usr/local/bin/fake-gateway"]

FROM gcr.io/distroless/static-debian12:nonroot AS fake-carrier
LABEL org.opencontainers.image.title="fake-carrier" \
      org.opencontainers.image.description="Fake carrier of the pipeline demo: pickup bookings with idempotency keys"
COPY --from=build /out/fake-carrier /usr/local/bin/
USER nonroot:nonroot
# /v1/pickups, /healthz and /faults.
EXPOSE 8082
ENTRYPOINT ["/usr/local/bin/fake-carrier"]

# The shipping example (examples/shipping), the second service of the
# pipeline: it consumes order.paid from the payment service's outbox.
FROM gcr.io/distroless/static-debian12:nonroot AS shipping-service
LABEL org.opencontainers.image.title="shipping-service" \
      org.opencontainers.image.description="Shipping example on the inbox kit: books a carrier pickup per paid order, exactly once"
COPY --from=build /out/shipping-service /usr/local/bin/
USER nonroot:nonroot
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/shipping-service"]

FROM gcr.io/distroless/static-debian12:nonroot AS order-publisher
LABEL org.opencontainers.image.title="order-publisher" \
      org.opencontainers.image.description="Demo load for the RabbitMQ inbox payment-service template: publishes order.placed messages"
COPY --from=build /out/order-publisher /usr/local/bin/
# Where the Compose demo load records that it ran (order-publisher -once): a
# named volume mounted here starts with this directory's owner, nonroot.
COPY --from=build --chown=nonroot:nonroot /state/order-publisher /var/lib/order-publisher
USER nonroot:nonroot
# No EXPOSE: the publisher only connects to RabbitMQ and listens on no port.
ENTRYPOINT ["/usr/local/bin/order-publisher"]

# Any other program of cmd/ (a consumer of your own in cmd/refund-service,
# say) as an image of its own, with no line to add here:
#   docker build --target program --build-arg PROGRAM=refund-service -t refund-service:dev .
FROM gcr.io/distroless/static-debian12:nonroot AS program
ARG PROGRAM
LABEL org.opencontainers.image.description="One program of the RabbitMQ inbox consumer template, chosen with --build-arg PROGRAM"
COPY --from=build /out/${PROGRAM} /usr/local/bin/program
USER nonroot:nonroot
ENTRYPOINT ["/usr/local/bin/program"]

# The last stage, so that a plain `docker build .` gives the service image.
FROM gcr.io/distroless/static-debian12:nonroot AS payment-service
LABEL org.opencontainers.image.title="payment-service" \
      org.opencontainers.image.description="RabbitMQ inbox payment-service template: payment-service and the inboxctl operations CLI"
COPY --from=build /out/payment-service /out/inboxctl /usr/local/bin/
USER nonroot:nonroot
# /healthz, /readyz and /metrics (and /faults/crash when FAULTS_ENABLED).
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/payment-service"]
