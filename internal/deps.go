//go:build deps

// Package internal pins the module's dependencies while components are built
// in parallel. Removed once every dependency is imported by real code.
package internal

import (
	_ "github.com/alicebob/miniredis/v2"
	_ "github.com/chromedp/chromedp"
	_ "github.com/coder/websocket"
	_ "github.com/gofiber/fiber/v2"
	_ "github.com/golang-jwt/jwt/v5"
	_ "github.com/google/uuid"
	_ "github.com/jackc/pgx/v5/pgxpool"
	_ "github.com/prometheus/client_golang/prometheus"
	_ "github.com/redis/go-redis/v9"
	_ "github.com/twmb/franz-go/pkg/kadm"
	_ "github.com/twmb/franz-go/pkg/kfake"
	_ "github.com/twmb/franz-go/pkg/kgo"
	_ "golang.org/x/time/rate"
)
