package wiring

import (
	"strings"
	"testing"
	"time"
)

func TestConfigDefenseFleet(t *testing.T) {
	tests := []struct {
		name      string
		env       map[string]string
		wantShare time.Duration
		wantID    string
		wantErr   string
	}{
		{name: "defaults", wantShare: 100 * time.Millisecond},
		{name: "interval", env: map[string]string{"FLASHSALE_DEFENSE_SHARE_INTERVAL": "250ms"}, wantShare: 250 * time.Millisecond},
		{name: "off", env: map[string]string{"FLASHSALE_DEFENSE_SHARE_INTERVAL": "0"}, wantShare: 0},
		{name: "too slow", env: map[string]string{"FLASHSALE_DEFENSE_SHARE_INTERVAL": "2s"}, wantErr: "FLASHSALE_DEFENSE_SHARE_INTERVAL"},
		{name: "negative", env: map[string]string{"FLASHSALE_DEFENSE_SHARE_INTERVAL": "-1s"}, wantErr: "FLASHSALE_DEFENSE_SHARE_INTERVAL"},
		{name: "not a duration", env: map[string]string{"FLASHSALE_DEFENSE_SHARE_INTERVAL": "fast"}, wantErr: "FLASHSALE_DEFENSE_SHARE_INTERVAL"},
		{name: "id", env: map[string]string{"FLASHSALE_GATEWAY_ID": "edge-3"}, wantShare: 100 * time.Millisecond, wantID: "edge-3"},
		{name: "id with space", env: map[string]string{"FLASHSALE_GATEWAY_ID": "edge 3"}, wantErr: "FLASHSALE_GATEWAY_ID"},
		{name: "id too long", env: map[string]string{"FLASHSALE_GATEWAY_ID": strings.Repeat("x", 65)}, wantErr: "FLASHSALE_GATEWAY_ID"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := Defaults()
			err := c.FromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.DefenseShareInterval != tt.wantShare || c.GatewayID != tt.wantID {
				t.Errorf("got interval %s id %q, want %s %q", c.DefenseShareInterval, c.GatewayID, tt.wantShare, tt.wantID)
			}
		})
	}
}
