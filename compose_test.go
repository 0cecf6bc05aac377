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
	cmd.Env = append(os.Environ(), "FLASHSALE_JWT_SECRET=compose-test")
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
	// Without the secret the file must refuse to render.
	cmd = exec.Command(bin, "-f", "compose.yaml", "config")
	cmd.Env = []string{"PATH=" + os.Getenv("PATH")}
	if out, err := cmd.CombinedOutput(); err == nil {
		t.Fatalf("compose.yaml rendered without FLASHSALE_JWT_SECRET:\n%s", out)
	}
}
