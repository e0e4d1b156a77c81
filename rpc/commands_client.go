package rpc

import "context"

// GetState returns the agent's state.
func (c *Client) GetState(ctx context.Context) (*State, error) {
	var s State
	if err := c.Call(ctx, GetStateCommand{}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// GetMessages returns the session's messages.
func (c *Client) GetMessages(ctx context.Context) ([]Message, error) {
	var d struct {
		Messages []Message `json:"messages"`
	}
	err := c.Call(ctx, GetMessagesCommand{}, &d)
	return d.Messages, err
}

// GetAvailableModels lists the models the agent can switch to.
func (c *Client) GetAvailableModels(ctx context.Context) ([]Model, error) {
	var d struct {
		Models []Model `json:"models"`
	}
	err := c.Call(ctx, GetAvailableModelsCommand{}, &d)
	return d.Models, err
}

// SetModel switches the model.
func (c *Client) SetModel(ctx context.Context, provider, modelID string) (*Model, error) {
	var m Model
	if err := c.Call(ctx, SetModelCommand{Provider: provider, ModelID: modelID}, &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// Bash runs a shell command in the agent's session (outside any turn).
func (c *Client) Bash(ctx context.Context, command string) (*BashResult, error) {
	var r BashResult
	if err := c.Call(ctx, BashCommand{Command: command}, &r); err != nil {
		return nil, err
	}
	return &r, nil
}

// NewSession starts a fresh session; cancelled reports an extension veto.
func (c *Client) NewSession(ctx context.Context, parent string) (cancelled bool, err error) {
	var d struct {
		Cancelled bool `json:"cancelled"`
	}
	err = c.Call(ctx, NewSessionCommand{ParentSession: parent}, &d)
	return d.Cancelled, err
}

// SwitchSession loads another session file; cancelled reports a veto.
func (c *Client) SwitchSession(ctx context.Context, path string) (cancelled bool, err error) {
	var d struct {
		Cancelled bool `json:"cancelled"`
	}
	err = c.Call(ctx, SwitchSessionCommand{SessionPath: path}, &d)
	return d.Cancelled, err
}

// GetSessionStats returns the session's counters.
func (c *Client) GetSessionStats(ctx context.Context) (*SessionStats, error) {
	var s SessionStats
	if err := c.Call(ctx, GetSessionStatsCommand{}, &s); err != nil {
		return nil, err
	}
	return &s, nil
}

// SetSessionName names the session.
func (c *Client) SetSessionName(ctx context.Context, name string) error {
	return c.Call(ctx, SetSessionNameCommand{Name: name}, nil)
}
