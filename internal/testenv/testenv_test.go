package testenv

import (
	"errors"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRequire runs the decision in a child test process: a missing tool skips without CI/KVSHM_REQUIRE_TOOLS and
// fails with either.
func TestRequire(t *testing.T) {
	if os.Getenv("TESTENV_CHILD") != "" {
		Require(t, errors.New("no such file"), "a tool", "install it")
		return
	}
	for _, c := range []struct {
		env  []string
		want string
	}{
		{nil, "--- SKIP"},
		{[]string{"CI=true"}, "--- FAIL"},
		{[]string{"KVSHM_REQUIRE_TOOLS=1"}, "--- FAIL"},
	} {
		cmd := exec.Command(os.Args[0], "-test.run", "^TestRequire$", "-test.v")
		cmd.Env = append(filteredEnv(), append(c.env, "TESTENV_CHILD=1")...)
		out, _ := cmd.CombinedOutput()
		if !strings.Contains(string(out), c.want) || !strings.Contains(string(out), "a tool") {
			t.Errorf("with %v: want %q naming the tool, got:\n%s", c.env, c.want, out)
		}
	}
	Require(t, nil, "nothing", "") // nil error: no effect
}

func filteredEnv() []string {
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CI=") && !strings.HasPrefix(kv, "KVSHM_REQUIRE_TOOLS=") {
			env = append(env, kv)
		}
	}
	return env
}
