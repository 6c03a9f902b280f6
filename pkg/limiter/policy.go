package limiter

// Rate is a dimension's limits: tokens per minute, requests per minute, or
// both. A burst of zero means one minute's worth; a zero rate, no limit.
type Rate struct {
	TokensPerMinute   float64
	TokenBurst        float64
	RequestsPerMinute float64
	RequestBurst      float64
}

// Policy is the limits of one tier, by dimension.
type Policy struct {
	Tenant, User, IP Rate
}

// Caller is who a request is charged to. Empty fields are not limited.
type Caller struct {
	Tenant, User, IP string
}

// CountsTokens says whether any dimension limits tokens, i.e. whether a
// request's token cost must be known to charge it.
func (p Policy) CountsTokens() bool {
	return p.Tenant.TokensPerMinute > 0 || p.User.TokensPerMinute > 0 || p.IP.TokensPerMinute > 0
}

// Buckets returns every bucket a request costing tokens is charged
// against, in a fixed order: tenant, user, IP; tokens before requests. A
// user's buckets are its tenant's (in the tenant's group); the IP's are in
// a group of their own, decided after the tenant's on a cluster.
func (p Policy) Buckets(c Caller, tokens float64) []Bucket {
	userGroup := TenantGroup(c.Tenant)
	if c.Tenant == "" {
		userGroup = "u:" + c.User
	}
	var out []Bucket
	for _, d := range []struct {
		dim, id, group string
		rate           Rate
	}{{"tenant", c.Tenant, TenantGroup(c.Tenant), p.Tenant}, {"user", c.User, userGroup, p.User}, {"ip", c.IP, AddressGroup(c.IP), p.IP}} {
		if d.id == "" {
			continue
		}
		if r := d.rate.TokensPerMinute; r > 0 {
			out = append(out, Bucket{Dimension: d.dim, ID: d.id, Kind: Tokens,
				Capacity: burst(d.rate.TokenBurst, r), PerSecond: r / 60, Cost: tokens, Group: d.group})
		}
		if r := d.rate.RequestsPerMinute; r > 0 {
			out = append(out, Bucket{Dimension: d.dim, ID: d.id, Kind: Requests,
				Capacity: burst(d.rate.RequestBurst, r), PerSecond: r / 60, Cost: 1, Group: d.group})
		}
	}
	return out
}

func burst(b, perMinute float64) float64 {
	if b > 0 {
		return b
	}
	return perMinute
}
