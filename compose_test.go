package flashsale_test

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestComposeConfig validates compose.yaml with docker-compose (no engine
// needed) and checks the stack has the production shape.
func TestComposeConfig(t *testing.T) {
	bin, err := exec.LookPath("docker-compose")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("docker-compose is not installed (.ci/run installs it)")
		}
		t.Skip("docker-compose not installed (apt-get install docker-compose)")
	}
	cmd := exec.Command(bin, "-f", "compose.yaml", "config", "--services")
	cmd.Env = append(os.Environ(), "FLASHSALE_JWT_SECRET=compose-test-0123456789abcdef-compose")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config: %v\n%s", err, out)
	}
	got := map[string]bool{}
	for _, s := range strings.Fields(string(out)) {
		got[s] = true
	}
	for _, want := range []string{"redis", "postgres", "kafka", "migrate", "gateway-1", "gateway-2", "writer", "expiry"} {
		if !got[want] {
			t.Errorf("service %q missing from compose.yaml (have %v)", want, got)
		}
	}
	// The cluster override puts every role on a three-master Redis
	// Cluster and no role on the single node's URL.
	cmd = exec.Command(bin, "-f", "compose.yaml", "-f", "compose.cluster.yaml", "config")
	cmd.Env = append(os.Environ(), "FLASHSALE_JWT_SECRET=compose-test-0123456789abcdef-compose")
	out, err = cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("docker-compose config with compose.cluster.yaml: %v\n%s", err, out)
	}
	cfg := string(out)
	for _, want := range []string{"redis-2:", "redis-3:", "redis-cluster-init:", "--cluster-enabled"} {
		if !strings.Contains(cfg, want) {
			t.Errorf("the cluster stack has no %q", want)
		}
	}
	const seeds = "FLASHSALE_REDIS_CLUSTER: redis:6379,redis-2:6379,redis-3:6379"
	if n := strings.Count(cfg, seeds); n != 5 {
		t.Errorf("%d services with %q, want 5 (migrate, two gateways, writer, expiry)", n, seeds)
	}
	if n := strings.Count(cfg, "FLASHSALE_REDIS_URL: redis://"); n != 0 {
		t.Errorf("%d services of the cluster stack still on FLASHSALE_REDIS_URL", n)
	}

	// Without the secret the file must refuse to render.
	cmd = exec.Command(bin, "-f", "compose.yaml", "config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("compose.yaml rendered without FLASHSALE_JWT_SECRET:\n%s", out)
	}
}
