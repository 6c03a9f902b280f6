// Command sluice-worker runs a Temporal worker for Sluice's chat workflows
// and activities, and the admission janitor.
package main

import "github.com/sluice-dev/sluice/app"

func main() { app.Main("sluice-worker", app.RunWorker) }
