package overhead

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// The 429 path measured with the bench's own Go client shares the two
// cores with it: the client costs about as much as the server. wrk (C,
// one thread; apt-get install wrk) is a far lighter client, so that phase
// shows what the server does when it gets the CPU. It is skipped when
// wrk is not installed.

// wrkResult is what one wrk run reported.
type wrkResult struct {
	rps              float64
	p50, p90, p99    time.Duration
	requests, not429 int
	errors           string
}

// wrkScript posts body with the given headers and counts every response
// that is not a 429.
const wrkScript = `
wrk.method = "POST"
wrk.body = %q
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = %q
local not429 = 0
function response(status, headers, body)
  if status ~= 429 then not429 = not429 + 1 end
end
function done(summary, latency, requests)
  io.write(string.format("NOT429 %%d\n", not429))
end
`

// runWrk runs wrk closed loop over conns connections for d against url.
func runWrk(ctx context.Context, url, body, key string, conns int, d time.Duration) (wrkResult, error) {
	bin, err := exec.LookPath("wrk")
	if err != nil {
		return wrkResult{}, err
	}
	dir, err := os.MkdirTemp("", "sluice-wrk")
	if err != nil {
		return wrkResult{}, err
	}
	defer os.RemoveAll(dir)
	script := filepath.Join(dir, "post.lua")
	// The Lua done() runs per thread; %q gives Lua-compatible quoting for
	// these ASCII strings.
	if err := os.WriteFile(script, []byte(fmt.Sprintf(wrkScript, body, "Bearer "+key)), 0o600); err != nil {
		return wrkResult{}, err
	}
	out, err := exec.CommandContext(ctx, bin, "-t1", "-c"+strconv.Itoa(conns), "-d"+d.String(), "--latency", "-s", script, url).CombinedOutput()
	if err != nil {
		return wrkResult{}, fmt.Errorf("wrk: %w: %s", err, out)
	}
	return parseWrk(string(out))
}

var (
	wrkRPS     = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct     = regexp.MustCompile(`(?m)^\s+(50|90|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkTotal   = regexp.MustCompile(`([0-9]+) requests in`)
	wrkNot429  = regexp.MustCompile(`NOT429 ([0-9]+)`)
	wrkSockErr = regexp.MustCompile(`Socket errors:.*`)
)

func parseWrk(out string) (wrkResult, error) {
	var r wrkResult
	m := wrkRPS.FindStringSubmatch(out)
	if m == nil {
		return r, fmt.Errorf("wrk: no Requests/sec in %q", out)
	}
	r.rps, _ = strconv.ParseFloat(m[1], 64)
	for _, p := range wrkPct.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(p[2], 64)
		unit := map[string]time.Duration{"us": time.Microsecond, "ms": time.Millisecond, "s": time.Second}[p[3]]
		d := time.Duration(v * float64(unit))
		switch p[1] {
		case "50":
			r.p50 = d
		case "90":
			r.p90 = d
		case "99":
			r.p99 = d
		}
	}
	if m := wrkTotal.FindStringSubmatch(out); m != nil {
		r.requests, _ = strconv.Atoi(m[1])
	}
	if m := wrkNot429.FindStringSubmatch(out); m != nil {
		r.not429, _ = strconv.Atoi(m[1])
	}
	r.errors = strings.TrimSpace(wrkSockErr.FindString(out))
	return r, nil
}
