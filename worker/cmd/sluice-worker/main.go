// Command sluice-worker runs a Temporal worker for Sluice's chat workflows
// and activities, and the admission janitor.
package main

import "github.com/sluice-dev/sluice/worker/process"

func main() { process.Main("sluice-worker", process.RunWorker) }
