package kbcli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// state is what earlier runs ingested, per target (server and kb): for
// each document id, the hash of the content sent and the revision the
// server answered. It is a cache, never the truth: a document is skipped
// only when the kb still holds that revision (ingestFiles asks).
type state struct {
	path    string
	Version int                            `json:"version"`
	Targets map[string]map[string]docState `json:"targets"`
}

type docState struct {
	SHA256 string `json:"sha256"`
	Rev    string `json:"rev"`
}

const stateVersion = 1

// loadState reads the state file at path; a missing file is an empty
// state, and path "" is a state that is never written.
func loadState(path string) (*state, error) {
	s := &state{path: path, Version: stateVersion, Targets: map[string]map[string]docState{}}
	if path == "" {
		return s, nil
	}
	raw, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read the state file: %w", err)
	}
	if err := json.Unmarshal(raw, s); err != nil || s.Version != stateVersion {
		return nil, fmt.Errorf("state file %s is not one this command wrote (%v); move it away to start afresh", path, err)
	}
	if s.Targets == nil {
		s.Targets = map[string]map[string]docState{}
	}
	return s, nil
}

// target is the documents of one server's kb.
func (s *state) target(base, kb string) map[string]docState {
	key := base + " " + kb
	if s.Targets[key] == nil {
		s.Targets[key] = map[string]docState{}
	}
	return s.Targets[key]
}

// save writes the state whole to a temporary file and renames it over
// the old one, so an interrupted run leaves the last complete state.
func (s *state) save() error {
	if s.path == "" {
		return nil
	}
	raw, err := json.MarshalIndent(s, "", " ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(s.path), ".sluice-ingest-*.tmp")
	if err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(raw); err != nil {
		tmp.Close()
		return fmt.Errorf("write the state file: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	if err := os.Rename(tmp.Name(), s.path); err != nil {
		return fmt.Errorf("write the state file: %w", err)
	}
	return nil
}
