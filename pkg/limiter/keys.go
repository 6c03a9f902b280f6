package limiter

import "strconv"

// Key layout. Each key carries its bucket group as a Redis Cluster hash
// tag, so that a script call deciding one group names keys of one slot:
//
//	<prefix>rl3:{<group>}:<dimension>:<id>:<kind>  a bucket (lua/bucket.lua)
//	<prefix>rl3:{<group>}:rb:<limiter id>:<n>      the reservations of one
//	                                               script call: field i is
//	                                               its i-th request's
//
// with groups t:<tenant> (a tenant's buckets and its users'), ip:<address>
// (Policy.Buckets), or <dimension>:<id> for a bucket named in no group.
//
// keyspace names the keys with the version of their format: after an
// upgrade the scripts never meet a key in an older format (a WRONGTYPE
// error for every request); the old keys expire on their own. Changing it
// starts every bucket full once, at the upgrade: what callers had used of
// their limits is forgotten. Reservations made before the upgrade are
// still refunded, into their old keys, so no request fails to finish; and
// the version before refunds this one's on a single Redis (the format of
// a reservation of one part is unchanged), so either may finish a request
// during a rolling upgrade. rl2 named a user's buckets by the user alone,
// so users of one name in two tenants shared them; in rl3 they are the
// tenant's.
const keyspace = "rl3:"

// group is the bucket's group: its own when it names none.
func (b Bucket) group() string {
	if b.Group != "" {
		return b.Group
	}
	return b.Dimension + ":" + b.ID
}

func (l *Limiter) bucketKey(b Bucket) string {
	return l.prefix + keyspace + "{" + b.group() + "}:" + b.Dimension + ":" + b.ID + ":" + string(b.Kind)
}

// batchKey names the reservation hash of one script call, in the slot of
// group: the group of the call's first bucket.
func (l *Limiter) batchKey(group string) string {
	return l.prefix + keyspace + "{" + group + "}:rb:" + l.id + ":" + strconv.FormatUint(l.seq.Add(1), 36)
}

// TenantGroup is the group of a tenant's buckets and its users'.
func TenantGroup(tenant string) string { return "t:" + tenant }

// AddressGroup is the group of a client address's buckets.
func AddressGroup(ip string) string { return "ip:" + ip }
