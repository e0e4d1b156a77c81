package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
)

// HostTool is a tool implemented by the host and offered to omp's model.
type HostTool struct {
	Name        string
	Label       string
	Description string
	// Parameters is the tool's JSON Schema (an object schema).
	Parameters json.RawMessage
	// LoadMode defaults to "essential", so the model sees the tool directly
	// rather than as a discoverable device.
	LoadMode string
	// Run executes one call. ctx is cancelled when omp cancels the call
	// (host_tool_cancel) or the client closes. A returned error becomes an
	// isError result carrying its text.
	Run func(ctx context.Context, call *HostToolCall) (*HostToolResult, error)
}

// HostToolCall is one call of a host tool by the model.
type HostToolCall struct {
	ID         string
	ToolCallID string
	ToolName   string
	Arguments  json.RawMessage

	c *Client
}

// Update streams a partial result to the agent while the call runs.
func (hc *HostToolCall) Update(partial *HostToolResult) error {
	return hc.c.send(map[string]any{"type": "host_tool_update", "id": hc.ID, "partialResult": partial.wire()})
}

// HostToolResult is a tool's result: content blocks and optional details.
type HostToolResult struct {
	Content []ContentBlock
	Details any
}

// TextResult is a result holding one text block.
func TextResult(text string) *HostToolResult {
	return &HostToolResult{Content: []ContentBlock{{Type: "text", Text: text}}}
}

func (r *HostToolResult) wire() map[string]any {
	m := map[string]any{"content": []ContentBlock{}}
	if r != nil {
		if r.Content != nil {
			m["content"] = r.Content
		}
		if r.Details != nil {
			m["details"] = r.Details
		}
	}
	return m
}

type hostTools struct {
	mu    sync.RWMutex
	tools map[string]HostTool
}

// SetHostTools replaces the host tools omp offers its model (omp only).
func (c *Client) SetHostTools(ctx context.Context, tools []HostTool) error {
	defs := make([]HostToolDefinition, 0, len(tools))
	m := make(map[string]HostTool, len(tools))
	for _, t := range tools {
		if t.Name == "" || t.Run == nil {
			return errors.New("rpc: a host tool needs a name and a Run function")
		}
		if _, dup := m[t.Name]; dup {
			return fmt.Errorf("rpc: host tool %q registered twice", t.Name)
		}
		if t.LoadMode == "" {
			t.LoadMode = "essential"
		}
		params := t.Parameters
		if len(params) == 0 {
			params = json.RawMessage(`{"type":"object","properties":{}}`)
		}
		m[t.Name] = t
		defs = append(defs, HostToolDefinition{Name: t.Name, Label: t.Label, Description: t.Description, Parameters: params, LoadMode: t.LoadMode})
	}
	// Install before the agent can call: a call may arrive as soon as the
	// command is read.
	c.tools.mu.Lock()
	old := c.tools.tools
	c.tools.tools = m
	c.tools.mu.Unlock()
	if err := c.Call(ctx, SetHostToolsCommand{Tools: defs}, nil); err != nil {
		c.tools.mu.Lock()
		c.tools.tools = old
		c.tools.mu.Unlock()
		return err
	}
	return nil
}

func (c *Client) handleHostToolCall(line []byte) {
	var call HostToolCallEvent
	if err := json.Unmarshal(line, &call); err != nil || call.ID == "" {
		c.reportError(&ProtocolError{Op: "host_tool_call", Err: fmt.Errorf("malformed host_tool_call: %v", err)})
		return
	}
	c.tools.mu.RLock()
	tool, ok := c.tools.tools[call.ToolName]
	c.tools.mu.RUnlock()
	c.mu.Lock()
	if c.exitErr != nil || c.closed {
		c.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	c.toolCancel[call.ID] = cancel
	c.mu.Unlock()

	hc := &HostToolCall{ID: call.ID, ToolCallID: call.ToolCallID, ToolName: call.ToolName, Arguments: call.Arguments, c: c}
	select {
	case c.toolSem <- struct{}{}:
	default:
		// Refused at once, but written by replyLoop: the reader never
		// writes, so an agent that stops reading its stdin cannot stall it.
		c.mu.Lock()
		delete(c.toolCancel, call.ID)
		c.mu.Unlock()
		cancel()
		c.queueReply(hostToolResultFrame(hc.ID, nil, fmt.Errorf("host tool %q: too many concurrent calls (limit %d)", call.ToolName, c.opts.HostToolConcurrency)), "host tool refusal")
		return
	}
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer func() { <-c.toolSem }()
		var res *HostToolResult
		var err error
		if !ok {
			err = fmt.Errorf("host tool %q is not registered", call.ToolName)
		} else {
			res, err = runTool(ctx, tool, hc)
		}
		if ctx.Err() != nil {
			// Cancelled by omp or by Close: omp ignores a late result.
			c.mu.Lock()
			delete(c.toolCancel, hc.ID)
			c.mu.Unlock()
			return
		}
		c.finishHostTool(hc, res, err, cancel)
	}()
}

func runTool(ctx context.Context, tool HostTool, hc *HostToolCall) (res *HostToolResult, err error) {
	defer func() {
		if v := recover(); v != nil {
			err = fmt.Errorf("host tool %q panicked: %v", hc.ToolName, v)
		}
	}()
	return tool.Run(ctx, hc)
}

func (c *Client) finishHostTool(hc *HostToolCall, res *HostToolResult, err error, cancel context.CancelFunc) {
	c.mu.Lock()
	delete(c.toolCancel, hc.ID)
	c.mu.Unlock()
	defer cancel()
	if werr := c.send(hostToolResultFrame(hc.ID, res, err)); werr != nil {
		c.log.Warn("rpc: could not send a host tool result", "tool", hc.ToolName, "err", werr)
	}
}

func hostToolResultFrame(id string, res *HostToolResult, err error) map[string]any {
	frame := map[string]any{"type": "host_tool_result", "id": id}
	if err != nil {
		frame["result"] = TextResult(err.Error()).wire()
		frame["isError"] = true
	} else {
		frame["result"] = res.wire()
	}
	return frame
}

// replyBacklog bounds the frames the reader queues for replyLoop (host
// tool refusals, cancellations of undecodable dialogs). Only an agent that
// sends that many requests without reading its stdin fills it.
const replyBacklog = 64

// queueReply hands a frame to replyLoop without blocking. When the queue
// is full the agent has not read its stdin for replyBacklog replies: the
// frame is dropped and the drop reported.
func (c *Client) queueReply(frame map[string]any, what string) {
	select {
	case c.replies <- frame:
	default:
		c.reportError(fmt.Errorf("rpc: a %s was dropped: %d replies wait for the agent to read its stdin", what, replyBacklog))
	}
}

// replyLoop writes the frames the reader queued, in order, until Close.
func (c *Client) replyLoop() {
	defer c.wg.Done()
	for {
		select {
		case frame := <-c.replies:
			if err := c.send(frame); err != nil && c.Err() == nil {
				c.log.Warn("rpc: could not send a reply", "type", frame["type"], "err", err)
			}
		case <-c.quit:
			return
		}
	}
}

// handleCancel cancels the running host tool call or UI dialog a cancel
// frame targets.
func (c *Client) handleCancel(line []byte, set map[string]context.CancelFunc) {
	var e struct {
		TargetID string `json:"targetId"`
	}
	if err := json.Unmarshal(line, &e); err != nil {
		c.reportError(&ProtocolError{Op: "cancel", Err: err})
		return
	}
	c.mu.Lock()
	cancel := set[e.TargetID]
	delete(set, e.TargetID)
	c.mu.Unlock()
	if cancel != nil {
		cancel()
	}
}
