package latency

// RedisAddr is the test redis-server's address, for the Example.
func RedisAddr() string { return srv.Addr }
