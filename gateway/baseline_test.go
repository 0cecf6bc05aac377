package gateway

import (
	"context"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

func TestServeBaseline(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ServeBaseline(ctx, ln) }()
	res, err := http.Post("http://"+ln.Addr().String()+"/api/flash-sales/items/7/purchase", "", nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusGone || string(body) != string(soldOutBody) {
		t.Errorf("got %d %s, want 410 %s", res.StatusCode, body, soldOutBody)
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("ServeBaseline after cancel = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("ServeBaseline did not return after cancel")
	}
}
