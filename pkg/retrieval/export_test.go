package retrieval

// KBVersionLua exposes the script source to the external tests.
var KBVersionLua = kbVersionLua
