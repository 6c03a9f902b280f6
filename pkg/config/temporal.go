package config

// Temporal says where the Temporal frontend is and how workflows are started.
type Temporal struct {
	HostPort  string `yaml:"host_port"`
	Namespace string `yaml:"namespace"`
	// TaskQueue carries chat workflows and their activities.
	TaskQueue string `yaml:"task_queue"`
	// EagerStart asks the server to hand the first workflow task to the
	// starting process's own worker (needs system.enableEagerWorkflowStart).
	EagerStart bool `yaml:"eager_start"`
	// SearchAttributes enables upserting Sluice's custom search attributes;
	// the server must have them registered (make run and the tests do).
	SearchAttributes bool `yaml:"search_attributes"`
	// MaxConcurrentActivities bounds regular activities (LLM streams) per worker.
	MaxConcurrentActivities int `yaml:"max_concurrent_activities"`
	// MaxConcurrentWorkflowTasks bounds workflow tasks per worker.
	MaxConcurrentWorkflowTasks int `yaml:"max_concurrent_workflow_tasks"`
}

func defaultTemporal() Temporal {
	return Temporal{
		HostPort:                   "127.0.0.1:7233",
		Namespace:                  "default",
		TaskQueue:                  "sluice-chat",
		EagerStart:                 true,
		SearchAttributes:           true,
		MaxConcurrentActivities:    1000,
		MaxConcurrentWorkflowTasks: 100,
	}
}

func (t Temporal) validate(v *validator) {
	v.nonEmpty("temporal.host_port", t.HostPort)
	v.nonEmpty("temporal.namespace", t.Namespace)
	v.nonEmpty("temporal.task_queue", t.TaskQueue)
	v.positive("temporal.max_concurrent_activities", int64(t.MaxConcurrentActivities))
	v.positive("temporal.max_concurrent_workflow_tasks", int64(t.MaxConcurrentWorkflowTasks))
}
