// Package hashtag says which keys Redis Cluster keeps together. A cluster
// hashes only a key's hash tag — the text between its first '{' and the
// first '}' after it, when that is not empty — or else the whole key, into
// one of 16384 slots, and a script or a MULTI may name keys of one slot
// only. Sluice's key layouts put a tag in every key that a script or a
// transaction uses together with others; this package is for the callers
// that must split work by tag when the keys of one call cannot share one.
package hashtag

import "github.com/redis/go-redis/v9"

// Of returns the part of key that Redis Cluster hashes: its hash tag, or
// the whole key when it has none. Two keys with the same Of live in the
// same slot (two with different ones may too, by chance).
func Of(key string) string {
	for i := 0; i < len(key); i++ {
		if key[i] != '{' {
			continue
		}
		for j := i + 1; j < len(key); j++ {
			if key[j] == '}' {
				if j == i+1 {
					return key // "{}" is no tag: the whole key is hashed
				}
				return key[i+1 : j]
			}
		}
		return key // a '{' without a '}' after it is no tag
	}
	return key
}

// Splits reports whether rdb sends keys of different hash slots to
// different servers — a cluster client (or a ring, which shards by the
// same tags) — so that one script call may name keys of one tag only. A
// plain client talks to one server, where a script may name any keys.
func Splits(rdb any) bool {
	switch rdb.(type) {
	case *redis.ClusterClient, *redis.Ring:
		return true
	}
	return false
}
