package config

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"
)

// EnvPrefix starts every environment override. The variable name is the
// field's YAML path in upper case with dots as underscores:
// redis.addr -> SLUICE_REDIS_ADDR, pools.short.endpoints ->
// SLUICE_POOLS_SHORT_ENDPOINTS (comma-separated). Lists of structs
// (knowledge bases, API keys) and maps (limit tiers) can only be set in the
// file.
const EnvPrefix = "SLUICE_"

// envIgnored are SLUICE_* variables that are not settings: codec keys
// (codec.keys[].env) may be named SLUICE_CODEC_KEY_<id>, and the clients'
// own variables (the README's examples, sluice-keys) live in the same
// shells that start a server.
var envIgnored = []string{"SLUICE_CONFIG", "SLUICE_TEST_", codecKeyEnvPrefix, "SLUICE_KEY", "SLUICE_URL", "SLUICE_ADMIN_KEY"}

func applyEnv(cfg *Config, environ []string) error {
	fields := map[string]reflect.Value{}
	collectFields(reflect.ValueOf(cfg).Elem(), "", fields)
	var problems []string
	for _, kv := range environ {
		name, value, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) || ignoredEnv(name) {
			continue
		}
		f, known := fields[name]
		if !known {
			problems = append(problems, fmt.Sprintf("%s: unknown setting (deploy/sluice.example.yaml lists every setting)", name))
			continue
		}
		if err := setField(f, value); err != nil {
			problems = append(problems, fmt.Sprintf("%s: %v", name, err))
		}
	}
	if len(problems) > 0 {
		return fmt.Errorf("invalid environment:\n  %s", strings.Join(problems, "\n  "))
	}
	return nil
}

func ignoredEnv(name string) bool {
	for _, p := range envIgnored {
		if name == p || (strings.HasSuffix(p, "_") && strings.HasPrefix(name, p)) {
			return true
		}
	}
	return false
}

func collectFields(v reflect.Value, path string, out map[string]reflect.Value) {
	t := v.Type()
	for i := 0; i < t.NumField(); i++ {
		tag, opts, _ := strings.Cut(t.Field(i).Tag.Get("yaml"), ",")
		f := v.Field(i)
		if tag == "" && opts == "inline" && f.Kind() == reflect.Struct {
			// An inlined struct's fields are its parent's (limits.enabled).
			collectFields(f, path, out)
			continue
		}
		if tag == "" || tag == "-" {
			continue
		}
		name := strings.ToUpper(tag)
		if path != "" {
			name = path + "_" + name
		}
		switch {
		case f.Kind() == reflect.Struct:
			collectFields(f, name, out)
		case f.Kind() == reflect.Slice && f.Type().Elem().Kind() == reflect.Struct, f.Kind() == reflect.Map:
			// Lists of structs and maps (tiers) are file-only.
		default:
			out[EnvPrefix+name] = f
		}
	}
}

var durationType = reflect.TypeOf(time.Duration(0))

func setField(f reflect.Value, s string) error {
	if f.Type() == durationType {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("want a duration such as 30s: %w", err)
		}
		f.SetInt(int64(d))
		return nil
	}
	switch f.Kind() {
	case reflect.Pointer:
		// An optional value, such as tls.enabled: set means given.
		v := reflect.New(f.Type().Elem())
		if err := setField(v.Elem(), s); err != nil {
			return err
		}
		f.Set(v)
	case reflect.String:
		f.SetString(s)
	case reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false: %w", err)
		}
		f.SetBool(b)
	case reflect.Int, reflect.Int64:
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("want an integer: %w", err)
		}
		f.SetInt(n)
	case reflect.Float64:
		x, err := strconv.ParseFloat(s, 64)
		if err != nil {
			return fmt.Errorf("want a number: %w", err)
		}
		f.SetFloat(x)
	case reflect.Slice:
		if f.Type().Elem().Kind() != reflect.String {
			return fmt.Errorf("cannot be set from the environment")
		}
		var items []string
		for _, part := range strings.Split(s, ",") {
			if part = strings.TrimSpace(part); part != "" {
				items = append(items, part)
			}
		}
		f.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("cannot be set from the environment")
	}
	return nil
}
