// Package proxy runs a whole Sluice behind a real reverse proxy (Debian's
// HAProxy, started by the test on a free loopback port, appending
// X-Forwarded-For) with api.trusted_proxies naming it, and checks what
// that topology promises: every client is counted by its own address,
// not the proxy's, so a crowd through one proxy meets no per-address
// limit, cap or ban meant for one client; and a client that writes
// X-Forwarded-For itself gains nothing by it.
//
// Clients come from distinct loopback addresses (Linux routes all of
// 127.0.0.0/8 to lo), as users behind an ingress come from theirs.
//
// `make test` runs the forged-header test; the 2,000-client crowd runs
// with SLUICE_CHAOS=all (`make chaos`, `make proxy`).
package proxy

import (
	"flag"
	"fmt"
	"os"
	"testing"
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		fmt.Println("proxy tests skipped in -short mode")
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// slow skips a scenario outside make chaos / make proxy.
func slow(t *testing.T) {
	t.Helper()
	if os.Getenv("SLUICE_CHAOS") != "all" {
		t.Skip("SLUICE_CHAOS=all (make chaos, make proxy) runs it")
	}
}
