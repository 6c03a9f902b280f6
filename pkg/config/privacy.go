package config

// Privacy says how client addresses are kept out of Redis key names, the
// ban list and logs: as HMAC-SHA-256 under IPHashKey (pkg/iphash).
type Privacy struct {
	// IPHashKey keys the hash (SLUICE_PRIVACY_IP_HASH_KEY). Every process
	// of a deployment needs the same one. Empty: a public development
	// key, whose hashes anyone with Sluice's source can reverse by hashing
	// every IPv4 address; the API warns at start. Changing it starts
	// every per-IP rate limit and ban afresh.
	IPHashKey string `yaml:"ip_hash_key"`
}

func (p Privacy) validate(v *validator) {
	if p.IPHashKey != "" && len(p.IPHashKey) < 16 {
		// The length only: the key itself must not reach a log.
		v.add("privacy.ip_hash_key", "must be at least 16 characters (openssl rand -base64 32), got %d", len(p.IPHashKey))
	}
}
