// Command sluice-keys manages Sluice's API keys and abuse bans through the
// admin API: `sluice keys` under its own name (cmd/internal/keyscli).
//
//	sluice-keys create -tenant acme -user alice -tier standard -scopes chat,ingest
//	sluice-keys list [-tenant acme]
//	sluice-keys revoke <key id>
//	sluice-keys bans
//	sluice-keys unban <ip|key> <value>
//	sluice-keys version
//
// The admin key comes from $SLUICE_ADMIN_KEY; the server is -url, default
// $SLUICE_URL or http://127.0.0.1:8080.
package main

import (
	"context"
	"fmt"
	"os"

	"github.com/sluice-dev/sluice/cmd/internal/keyscli"
	"github.com/sluice-dev/sluice/pkg/version"
)

func main() {
	if version.Asked(os.Args[1:]) {
		fmt.Println(version.Line("sluice-keys"))
		return
	}
	os.Exit(keyscli.Main(context.Background(), "sluice-keys", os.Args[1:], os.Getenv, os.Stdout, os.Stderr))
}
