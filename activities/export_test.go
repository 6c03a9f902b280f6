package activities

// TooLateToPause is tooLateToPause, for the external tests.
var TooLateToPause = tooLateToPause
