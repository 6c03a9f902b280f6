// Package keyscli is the command that manages Sluice's API keys and abuse
// bans through the admin API, as `sluice keys` and as `sluice-keys`:
//
//	sluice keys create -tenant acme -user alice -tier standard -scopes chat,ingest
//	sluice keys list [-tenant acme]
//	sluice keys revoke <key id>
//	sluice keys bans
//	sluice keys unban <ip|key> <value>
//
// The admin credential (auth.admin_key, or a key with the admin scope) is
// read from $SLUICE_ADMIN_KEY, never from a flag, so that it stays out of
// shell history and process lists. The server is -url, default
// $SLUICE_URL or http://127.0.0.1:8080.
package keyscli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/sluice-dev/sluice/cmd/internal/apiclient"
)

// Main runs the command named prog ("sluice keys", "sluice-keys") with
// args and returns its exit code: 0 done (or help asked), 1 the admin API
// failed or refused, 2 a usage error. Messages go to stderr, results to
// stdout.
func Main(ctx context.Context, prog string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := Run(ctx, prog, args, getenv, stdout)
	var u usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		fmt.Fprintln(stdout, usage(prog))
		return 0
	case errors.As(err, &u):
		fmt.Fprintln(stderr, prog+":", err)
		return 2
	}
	fmt.Fprintln(stderr, prog+":", err)
	return 1
}

type usageError struct{ error }

func usage(prog string) string {
	return `usage: ` + prog + ` [-url URL] <command>
  create -tenant T [-user U] [-tier T] [-scopes chat,ingest,admin] [-quiet]
  list [-tenant T]
  revoke ID
  bans
  unban ip|key VALUE
The admin key comes from $SLUICE_ADMIN_KEY; -url defaults to $SLUICE_URL
or http://127.0.0.1:8080.`
}

// helpAsked reports whether args ask for help (-h, -help, --help, help)
// before any command.
func helpAsked(args []string) bool {
	return len(args) > 0 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help" || args[0] == "help")
}

// client calls the admin API.
type client struct{ apiclient.Client }

// Run runs one keys command with args and writes its result to out.
func Run(ctx context.Context, prog string, args []string, getenv func(string) string, out io.Writer) error {
	if helpAsked(args) {
		return flag.ErrHelp
	}
	fs := flag.NewFlagSet(prog, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	base := apiclient.BaseURL(getenv)
	fs.StringVar(&base, "url", base, "the API's base URL")
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		return err
	}
	if err != nil || fs.NArg() == 0 {
		return usageError{errors.New(usage(prog))}
	}
	cmd, rest := fs.Arg(0), fs.Args()[1:]
	if helpAsked(rest) {
		return flag.ErrHelp
	}
	c := client{apiclient.New(base, getenv("SLUICE_ADMIN_KEY"))}
	// Admin answers are small: a list of keys or bans.
	c.Limit = 8 << 20
	if c.Key == "" {
		return usageError{errors.New("set SLUICE_ADMIN_KEY to the admin key (or a key with the admin scope)")}
	}
	switch cmd {
	case "create":
		return c.create(ctx, prog, rest, out)
	case "list":
		return c.list(ctx, prog, rest, out)
	case "revoke":
		if len(rest) != 1 {
			return usageError{errors.New("usage: " + prog + " revoke ID")}
		}
		return c.Call(ctx, http.MethodDelete, "/v1/admin/keys/"+url.PathEscape(rest[0]), nil, nil)
	case "bans":
		return c.bans(ctx, out)
	case "unban":
		if len(rest) != 2 {
			return usageError{errors.New("usage: " + prog + " unban ip|key VALUE")}
		}
		return c.Call(ctx, http.MethodDelete, "/v1/admin/bans/"+url.PathEscape(rest[0])+"/"+url.PathEscape(rest[1]), nil, nil)
	}
	return usageError{fmt.Errorf("unknown command %q\n%s", cmd, usage(prog))}
}

type key struct {
	ID         string    `json:"id"`
	Key        string    `json:"key"`
	Masked     string    `json:"masked"`
	Tenant     string    `json:"tenant"`
	User       string    `json:"user"`
	Tier       string    `json:"tier"`
	Scopes     []string  `json:"scopes"`
	CreatedAt  time.Time `json:"created_at"`
	LastUsedAt time.Time `json:"last_used_at"`
	Revoked    bool      `json:"revoked"`
}

func (c client) create(ctx context.Context, prog string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("create", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tenant := fs.String("tenant", "", "tenant the key belongs to (required)")
	user := fs.String("user", "", "user within the tenant (default: the tenant)")
	tier := fs.String("tier", "", "limits tier (default: limits.default_tier)")
	scopes := fs.String("scopes", "chat", "comma-separated scopes: chat, ingest, admin")
	quiet := fs.Bool("quiet", false, "print only the key")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 || *tenant == "" {
		return usageError{errors.New("usage: " + prog + " create -tenant T [-user U] [-tier T] [-scopes chat,ingest,admin] [-quiet]")}
	}
	body := map[string]any{"tenant": *tenant, "user": *user, "tier": *tier, "scopes": strings.Split(*scopes, ",")}
	var k key
	if err := c.Call(ctx, http.MethodPost, "/v1/admin/keys", body, &k); err != nil {
		return err
	}
	if *quiet {
		_, err := fmt.Fprintln(out, k.Key)
		return err
	}
	_, err := fmt.Fprintf(out, "%s\n  id %s, tenant %s, user %s, tier %s, scopes %s\n  Keep it now: it is not shown again.\n",
		k.Key, k.ID, k.Tenant, orDash(k.User), orDash(k.Tier), strings.Join(k.Scopes, ","))
	return err
}

func (c client) list(ctx context.Context, prog string, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("list", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	tenant := fs.String("tenant", "", "only this tenant's keys")
	if err := fs.Parse(args); err != nil || fs.NArg() > 0 {
		return usageError{errors.New("usage: " + prog + " list [-tenant T]")}
	}
	path := "/v1/admin/keys"
	if *tenant != "" {
		path += "?tenant=" + url.QueryEscape(*tenant)
	}
	var res struct{ Keys []key }
	if err := c.Call(ctx, http.MethodGet, path, nil, &res); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KEY\tTENANT\tUSER\tTIER\tSCOPES\tCREATED\tLAST USED\tREVOKED")
	for _, k := range res.Keys {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%v\n", k.Masked, k.Tenant, orDash(k.User), orDash(k.Tier),
			strings.Join(k.Scopes, ","), stamp(k.CreatedAt), stamp(k.LastUsedAt), k.Revoked)
	}
	return tw.Flush()
}

func (c client) bans(ctx context.Context, out io.Writer) error {
	var res struct {
		Bans []struct {
			Kind, Value string
			Since       time.Time
			RemainingS  int `json:"remaining_s"`
		}
	}
	if err := c.Call(ctx, http.MethodGet, "/v1/admin/bans", nil, &res); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tVALUE\tSINCE\tREMAINING")
	for _, b := range res.Bans {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%ds\n", b.Kind, b.Value, stamp(b.Since), b.RemainingS)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func stamp(t time.Time) string {
	if t.IsZero() {
		return "never"
	}
	return t.UTC().Format(time.DateTime)
}
