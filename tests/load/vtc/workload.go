package vtc

import (
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// Row is one request of a workload.
type Row struct {
	Arrival        float64
	Client         string
	Prompt, Output int
}

// PaperRow is one scheduler's published result on a workload (AccDiff
// < 0: not published).
type PaperRow struct {
	Scheduler                             string
	AccDiff, MaxDiff, AvgDiff, Throughput float64
}

// Workload is a workload the package knows: its file and the paper's
// results on it, FCFS first.
type Workload struct {
	Name, File string
	Paper      []PaperRow
}

// DefaultDir holds the workloads, relative to the repository (a
// checkout that sits beside the shared directory).
const DefaultDir = "../shared/workloads"

// Workloads are the artifact's results as ../shared/workloads/README.md
// quotes them (recomputed there with the artifact's definitions).
var Workloads = map[string]Workload{
	"overload": {Name: "overload", File: "vtc-overload.csv", Paper: []PaperRow{
		{"FCFS", 237738, 447.4, 439.0, 876},
		{VTCUnknown, 8101, 192.9, 103.8, 893},
		{VTCKnown, 253, 5.9, 0.5, 895},
	}},
	"real": {Name: "real", File: "vtc-real.csv", Paper: []PaperRow{
		{"FCFS", -1, 760.0, 433.5, 777},
		{VTCUnknown, -1, 368.4, 251.7, 779},
		{VTCKnown, -1, 329.5, 227.5, 781},
		{"requests-per-minute limit 5", -1, 143.9, 83.6, 340},
	}},
}

// The paper's VTC rows: its scheduler not knowing the answers' lengths
// (it counts each output token as it is produced), and knowing them.
const (
	VTCUnknown = "VTC (output length unknown)"
	VTCKnown   = "VTC, output length known"
)

// Row is the paper's row of scheduler on the workload.
func (w Workload) Row(scheduler string) (PaperRow, bool) {
	for _, p := range w.Paper {
		if p.Scheduler == scheduler {
			return p, true
		}
	}
	return PaperRow{}, false
}

// Path is the workload's file under dir.
func (w Workload) Path(dir string) string { return filepath.Join(dir, w.File) }

// Load reads a workload's CSV: arrival_s, client, prompt_tokens,
// output_tokens; rows sorted by arrival.
func Load(path string) ([]Row, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	r := csv.NewReader(f)
	head, err := r.Read()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	if strings.Join(head, ",") != "arrival_s,client,prompt_tokens,output_tokens" {
		return nil, fmt.Errorf("%s: header %q, want arrival_s,client,prompt_tokens,output_tokens", path, head)
	}
	var rows []Row
	for line := 2; ; line++ {
		rec, err := r.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		at, err1 := strconv.ParseFloat(rec[0], 64)
		p, err2 := strconv.Atoi(rec[2])
		o, err3 := strconv.Atoi(rec[3])
		if err := errors.Join(err1, err2, err3); err != nil || at < 0 || p < 0 || o < 1 || rec[1] == "" {
			return nil, fmt.Errorf("%s:%d: bad row %q", path, line, rec)
		}
		rows = append(rows, Row{Arrival: at, Client: rec[1], Prompt: p, Output: o})
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Arrival < rows[j].Arrival })
	return rows, nil
}

// RowClients are the clients of rows, sorted.
func RowClients(rows []Row) []string {
	reqs := make([]Req, len(rows))
	for i, r := range rows {
		reqs[i] = Req{Client: r.Client}
	}
	return Clients(reqs)
}
