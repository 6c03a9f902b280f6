package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func TestRunPrintsDefaultPlan(t *testing.T) {
	var out bytes.Buffer
	if err := run(context.Background(), nil, &out); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"peak load: 800 QPS × (512 in + 256 out) tokens = 614400 tokens/s",
		"pooled         100%  800        512+256    614400          2000      499.20   500          61%",
		"short          70%  560        512+256    430080          2000      349.44   350          61%",
		"long          30%  240        512+256    184320          2000      149.76   150          61%",
		"short+long                                                                        500         (+0)",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunByRequestFraction(t *testing.T) {
	var out bytes.Buffer
	err := run(context.Background(), strings.Fields("-long-fraction 0.1 -long-input 2048 -long-output 512"), &out)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"short          67%  720    341.3+227.6", "333", "long          33%   80       2048+512", "167"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}

func TestRunSimulate(t *testing.T) {
	var out bytes.Buffer
	args := strings.Fields("-qps 4 -input 64 -output 16 -tokens-per-gpu 1000 -simulate -sim-duration 3s -time-scale 0.1 -max-num-seqs 4")
	if err := run(context.Background(), args, &out); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	// 4 × 80 / 800 × 1.3 = 0.52: one GPU, and no "one fewer" to simulate.
	for _, want := range []string{"simulation of the pooled plan", "plan     1          1", "one fewer     0", "no"} {
		if !strings.Contains(s, want) {
			t.Errorf("output lacks %q:\n%s", want, s)
		}
	}
}

func TestRunRejects(t *testing.T) {
	tests := []struct {
		args string
		want string
	}{
		{"-qps 0", "plan GPUs: peak QPS must be > 0, got 0"},
		{"-long-share 0.3 -long-fraction 0.1 -long-input 1 -long-output 1", "not both"},
		{"-utilization 2", "target utilisation must be in (0, 1], got 2"},
		{"extra", "unexpected arguments: [extra]"},
		{"-nope", "flag provided but not defined: -nope"},
	}
	for _, tt := range tests {
		var out bytes.Buffer
		err := run(context.Background(), strings.Fields(tt.args), &out)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: error = %v, want %q", tt.args, err, tt.want)
		}
	}
}
