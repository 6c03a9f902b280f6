// Package usagecli reads Sluice's usage ledger through the API: `sluice
// usage`, and sluice-usage under its own name:
//
//	sluice usage [-from 2026-12-01] [-to 2026-12-08] [-group-by day|user|key|model|tenant] [-tenant T] [-csv]
//
// With $SLUICE_ADMIN_KEY (auth.admin_key, or a key with the admin scope)
// it reads every tenant's usage (GET /v1/admin/usage), or one's with
// -tenant; with $SLUICE_KEY alone, the key's own tenant's (GET
// /v1/usage). Keys come from the environment, never from flags, so that
// they stay out of shell history and process lists. The server is -url,
// default $SLUICE_URL or http://127.0.0.1:8080. Days are UTC; -to is
// excluded.
package usagecli

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"text/tabwriter"

	"github.com/sluice-dev/sluice/cmd/internal/apiclient"
)

// Main runs the command, named name in its messages, with args and
// returns its exit code: 0 done or help asked, 1 failed, 2 misused.
func Main(ctx context.Context, name string, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	err := run(ctx, name, args, getenv, stdout)
	switch {
	case errors.Is(err, flag.ErrHelp):
		return 0
	case err != nil:
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		var u usageError
		if errors.As(err, &u) {
			return 2
		}
		return 1
	}
	return 0
}

type usageError struct{ error }

// row is one group of the API's answer.
type row struct {
	Tenant           string `json:"tenant"`
	Group            string `json:"group"`
	Requests         int64  `json:"requests"`
	Answered         int64  `json:"answered"`
	PromptTokens     int64  `json:"prompt_tokens"`
	CompletionTokens int64  `json:"completion_tokens"`
	CachedTokens     int64  `json:"cached_tokens"`
	TotalTokens      int64  `json:"total_tokens"`
}

func run(ctx context.Context, name string, args []string, getenv func(string) string, out io.Writer) error {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(out)
	base := apiclient.BaseURL(getenv)
	fs.StringVar(&base, "url", base, "the API's base URL (env SLUICE_URL)")
	from := fs.String("from", "", "first day, YYYY-MM-DD UTC (default: 30 days before -to)")
	to := fs.String("to", "", "day after the last, YYYY-MM-DD UTC (default: tomorrow)")
	groupBy := fs.String("group-by", "day", "day, user, key, model, service_tier, or tenant (admin only)")
	tenant := fs.String("tenant", "", "only this tenant (admin only)")
	csvOut := fs.Bool("csv", false, "print CSV with a header row instead of a table")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: "+name+" [flags]\nReads the usage ledger; the key comes from $SLUICE_ADMIN_KEY (every tenant) or $SLUICE_KEY (its own tenant).")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if fs.NArg() > 0 {
		return usageError{fmt.Errorf("unexpected arguments %v", fs.Args())}
	}
	path, key := "/v1/admin/usage", getenv("SLUICE_ADMIN_KEY")
	if key == "" {
		path, key = "/v1/usage", getenv("SLUICE_KEY")
		if *tenant != "" {
			return usageError{errors.New("-tenant needs $SLUICE_ADMIN_KEY: a tenant's key reads its own tenant only")}
		}
	}
	if key == "" {
		return usageError{errors.New("set SLUICE_ADMIN_KEY (every tenant) or SLUICE_KEY (its own tenant)")}
	}
	q := url.Values{"group_by": {*groupBy}}
	for name, v := range map[string]string{"from": *from, "to": *to, "tenant": *tenant} {
		if v != "" {
			q.Set(name, v)
		}
	}
	if *csvOut {
		q.Set("format", "csv")
	}
	body, err := apiclient.New(base, key).Do(ctx, http.MethodGet, path+"?"+q.Encode(), nil)
	if err != nil {
		return err
	}
	if *csvOut {
		_, err := out.Write(body)
		return err
	}
	var res struct {
		Tenant, From, To string
		GroupBy          string `json:"group_by"`
		Rows             []row
	}
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("decode the usage: %w", err)
	}
	return printTable(out, res.Tenant, res.GroupBy, res.Rows)
}

// printTable prints rows a column each: the tenant (the query's own when
// the rows do not name theirs, "" across tenants), the group unless it is
// the tenant, and the sums.
func printTable(out io.Writer, tenant, groupBy string, rows []row) error {
	tw := tabwriter.NewWriter(out, 0, 4, 2, ' ', tabwriter.AlignRight)
	group := strings.ToUpper(groupBy) + "\t"
	if groupBy == "tenant" {
		group = ""
	}
	fmt.Fprintf(tw, "TENANT\t%sREQUESTS\tANSWERED\tPROMPT\tCOMPLETION\tCACHED\tTOTAL\t\n", group)
	for _, r := range rows {
		t := orDash(cmp.Or(r.Tenant, tenant))
		if groupBy != "tenant" {
			t += "\t" + orDash(r.Group)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%d\t\n", t, r.Requests, r.Answered,
			r.PromptTokens, r.CompletionTokens, r.CachedTokens, r.TotalTokens)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
