# Production image: one static binary, every role selected by its subcommand.
FROM golang:1.26-bookworm AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o /out/flashsale ./cmd/flashsale

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/flashsale /flashsale
ENTRYPOINT ["/flashsale"]
