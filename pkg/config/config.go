// Package config loads Sluice's one YAML configuration file, applies
// SLUICE_* environment overrides and validates the result before anything
// starts, so that a bad value fails fast with the name of the field.
package config

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"

	"go.yaml.in/yaml/v3"
)

// Config is the whole of Sluice's configuration. Every field has a default
// (see Default); a file only needs the values it changes.
type Config struct {
	API       API       `yaml:"api"`
	Temporal  Temporal  `yaml:"temporal"`
	Redis     Redis     `yaml:"redis"`
	Events    Events    `yaml:"events"`
	Admission Admission `yaml:"admission"`
	Pools     Pools     `yaml:"pools"`
	Routing   Routing   `yaml:"routing"`
	LLM       LLM       `yaml:"llm"`
	Embedding Embedding `yaml:"embedding"`
	Rerank    Rerank    `yaml:"rerank"`
	Retrieval Retrieval `yaml:"retrieval"`
	Ingest    Ingest    `yaml:"ingest"`
	Sessions  Sessions  `yaml:"sessions"`
	Metrics   Metrics   `yaml:"metrics"`
	// Healing is the tail-latency healer (one workflow per deployment).
	Healing Healing `yaml:"healing"`
	// AnswerCache is the L3 tier: whole answers (off unless kbs are listed).
	AnswerCache AnswerCache `yaml:"answer_cache"`
	Auth        Auth        `yaml:"auth"`
	Limits      Limits      `yaml:"limits"`
	Log         Log         `yaml:"log"`
	// Codec encrypts workflow payloads before Temporal stores them (off
	// by default).
	Codec Codec `yaml:"codec"`
	// Privacy keys the hash that names client addresses.
	Privacy Privacy `yaml:"privacy"`
	// Usage is the usage ledger (off by default; make run uses SQLite).
	Usage Usage `yaml:"usage"`
	// Responses keeps stored responses (off by default; make run uses
	// SQLite).
	Responses Responses `yaml:"responses"`
	// Files keeps uploaded files, the batches' inputs and outputs (off by
	// default; make run uses a SQLite file).
	Files Files `yaml:"files"`
	// Prices are the models' prices, which spend budgets count in.
	Prices Prices `yaml:"prices"`
}

// Default returns a configuration that runs the local dev stack. Each
// section's defaults live beside its type. Load applies redis.addr,
// temporal.host_port and temporal.namespace last, after the sources that
// may set them another way.
func Default() Config {
	return Config{
		API:         defaultAPI(),
		Temporal:    defaultTemporal(),
		Redis:       defaultRedis(),
		Events:      defaultEvents(),
		Admission:   defaultAdmission(),
		Pools:       defaultPools(),
		Routing:     defaultRouting(),
		LLM:         defaultLLM(),
		Embedding:   defaultEmbedding(),
		Rerank:      defaultRerank(),
		Retrieval:   defaultRetrieval(),
		Ingest:      defaultIngest(),
		Sessions:    defaultSessions(),
		Metrics:     defaultMetrics(),
		Healing:     defaultHealing(),
		AnswerCache: defaultAnswerCache(),
		Auth:        defaultAuth(),
		Limits:      defaultLimits(),
		Log:         defaultLog(),
		Codec:       defaultCodec(),
		Usage:       defaultUsage(),
		Responses:   defaultResponses(),
		Files:       defaultFiles(),
	}
}

// Load reads path (if not empty) over the defaults, applies environment
// overrides from environ (KEY=VALUE pairs, as os.Environ returns) and
// validates the result. Where Redis and Temporal are is layered: the file,
// then SLUICE_* variables, then for Temporal its own TEMPORAL_* variables
// and profile file (see Temporal), and only then the defaults, so that a
// redis.url or a TEMPORAL_ADDRESS is not shadowed by a default address.
func Load(path string, environ []string) (Config, error) {
	cfg := Default()
	cfg.Redis.Addr, cfg.Temporal.HostPort, cfg.Temporal.Namespace = "", "", ""
	if path != "" {
		raw, err := os.ReadFile(path)
		if err != nil {
			return Config{}, fmt.Errorf("read config %s: %w", path, err)
		}
		dec := yaml.NewDecoder(strings.NewReader(string(raw)))
		dec.KnownFields(true)
		if err := dec.Decode(&cfg); err != nil && !errors.Is(err, io.EOF) {
			return Config{}, fmt.Errorf("parse config %s: %w", path, err)
		}
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return Config{}, err
	}
	cfg.Codec.readKeys(environ)
	cfg.Redis.fillDefaultAddr()
	if err := cfg.Temporal.resolve(environ); err != nil {
		return Config{}, err
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// FromCommandLine loads the configuration of a Sluice command: the file
// named by -config (default $SLUICE_CONFIG, none for the defaults) with the
// process's SLUICE_* environment on top.
func FromCommandLine(name string, args []string) (Config, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	path := fs.String("config", os.Getenv("SLUICE_CONFIG"), "YAML config file (env SLUICE_CONFIG); SLUICE_* variables override it")
	if err := fs.Parse(args); err != nil {
		return Config{}, err
	}
	if fs.NArg() > 0 {
		return Config{}, fmt.Errorf("%s: unexpected arguments %v", name, fs.Args())
	}
	return Load(*path, os.Environ())
}

// Validate checks every field and reports all problems at once, each
// naming its field by its YAML path. A check that compares two sections
// belongs to the section whose field it reports, which is handed what it
// compares against.
func (c Config) Validate() error {
	var v validator
	c.API.validate(&v, c.Events.TTL)
	c.Temporal.validate(&v)
	c.Redis.validate(&v)
	c.Events.validate(&v)
	c.Admission.validate(&v)
	c.Pools.validate(&v)
	c.Routing.validate(&v, c.Pools.Short)
	c.LLM.validate(&v)
	c.Embedding.validate(&v)
	c.Rerank.validate(&v)
	c.Retrieval.validate(&v)
	c.Ingest.validate(&v)
	c.Sessions.validate(&v)
	c.Metrics.validate(&v)
	c.Healing.validate(&v, c.Metrics.LatencyRetention)
	c.AnswerCache.validate(&v, c.Retrieval)
	c.Auth.validate(&v)
	c.PolicyDeployment().Validate(c.Policy(), v.add)
	c.Limits.validate(&v)
	c.Log.validate(&v)
	c.Codec.validate(&v)
	c.Privacy.validate(&v)
	c.Usage.validate(&v)
	c.Responses.validate(&v)
	c.Files.validate(&v)
	c.Prices.validate(&v)
	return v.err()
}
