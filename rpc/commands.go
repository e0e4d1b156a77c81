package rpc

// Prompting commands.
type (
	// PromptCommand starts a turn, or with StreamingBehavior queues into one.
	PromptCommand struct {
		Message           string         `json:"message"`
		Images            []ImageContent `json:"images,omitempty"`
		StreamingBehavior string         `json:"streamingBehavior,omitempty"`
	}
	SteerCommand struct {
		Message string         `json:"message"`
		Images  []ImageContent `json:"images,omitempty"`
	}
	FollowUpCommand struct {
		Message string         `json:"message"`
		Images  []ImageContent `json:"images,omitempty"`
	}
	AbortCommand          struct{}
	AbortAndPromptCommand struct {
		Message string         `json:"message"`
		Images  []ImageContent `json:"images,omitempty"`
	}
	NewSessionCommand struct {
		ParentSession string `json:"parentSession,omitempty"`
	}
	GetStateCommand           struct{}
	GetMessagesCommand        struct{}
	GetAvailableModelsCommand struct{}
	SetModelCommand           struct {
		Provider string `json:"provider"`
		ModelID  string `json:"modelId"`
	}
	BashCommand struct {
		Command string `json:"command"`
	}
	GetSessionStatsCommand struct{}
	SetSessionNameCommand  struct {
		Name string `json:"name"`
	}
	SwitchSessionCommand struct {
		SessionPath string `json:"sessionPath"`
	}
	SetHostToolsCommand struct {
		Tools []HostToolDefinition `json:"tools"`
	}
)

func (PromptCommand) CommandType() string             { return "prompt" }
func (SteerCommand) CommandType() string              { return "steer" }
func (FollowUpCommand) CommandType() string           { return "follow_up" }
func (AbortCommand) CommandType() string              { return "abort" }
func (AbortAndPromptCommand) CommandType() string     { return "abort_and_prompt" }
func (NewSessionCommand) CommandType() string         { return "new_session" }
func (GetStateCommand) CommandType() string           { return "get_state" }
func (GetMessagesCommand) CommandType() string        { return "get_messages" }
func (GetAvailableModelsCommand) CommandType() string { return "get_available_models" }
func (SetModelCommand) CommandType() string           { return "set_model" }
func (BashCommand) CommandType() string               { return "bash" }
func (GetSessionStatsCommand) CommandType() string    { return "get_session_stats" }
func (SetSessionNameCommand) CommandType() string     { return "set_session_name" }
func (SwitchSessionCommand) CommandType() string      { return "switch_session" }
func (SetHostToolsCommand) CommandType() string       { return "set_host_tools" }
