package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// UI dialog methods that want an answer; every other extension UI method
// (notify, setStatus, setWidget, setTitle, set_editor_text, open_url) is
// fire-and-forget and surfaces only as an event.
var dialogMethods = map[string]bool{"select": true, "confirm": true, "input": true, "editor": true}

// UIRequest is an extension UI dialog the agent wants answered.
type UIRequest = ExtensionUIRequestEvent

// UIResponse answers a dialog: exactly one of a value, a confirmation or a
// cancellation. Build it with Value, Confirmed or Cancelled.
type UIResponse struct {
	value     *string
	confirmed *bool
	cancelled bool
}

// Value answers select, input and editor dialogs.
func Value(v string) UIResponse { return UIResponse{value: &v} }

// Confirmed answers a confirm dialog.
func Confirmed(ok bool) UIResponse { return UIResponse{confirmed: &ok} }

// Cancelled dismisses any dialog.
func Cancelled() UIResponse { return UIResponse{cancelled: true} }

// UIHandler answers one dialog. ctx is cancelled when the dialog's timeout
// passes, the client closes, or (omp only) the agent withdraws the dialog;
// the handler should then return promptly (its answer is dropped). pi sends
// nothing when an extension withdraws a dialog, so with pi the handler runs
// until it answers, and that late answer is ignored by the agent.
type UIHandler func(ctx context.Context, req *UIRequest) UIResponse

// Dialog is a UI request delivered on a channel (see UIChannel).
type Dialog struct {
	Request *UIRequest
	// Context ends when the dialog is withdrawn or the client closes.
	Context context.Context
	reply   chan UIResponse
}

// Reply answers the dialog. Only the first reply counts; it never blocks.
func (d *Dialog) Reply(r UIResponse) {
	select {
	case d.reply <- r:
	default:
	}
}

// UIChannel returns a UIHandler that sends each dialog on ch and waits for
// its Reply. If nobody takes the dialog before it is withdrawn, it is
// cancelled. The channel is never closed by the client.
func UIChannel(ch chan<- *Dialog) UIHandler {
	return func(ctx context.Context, req *UIRequest) UIResponse {
		d := &Dialog{Request: req, Context: ctx, reply: make(chan UIResponse, 1)}
		select {
		case ch <- d:
		case <-ctx.Done():
			return Cancelled()
		}
		select {
		case r := <-d.reply:
			return r
		case <-ctx.Done():
			return Cancelled()
		}
	}
}

func (c *Client) handleUIRequest(line []byte) {
	var req UIRequest
	if err := json.Unmarshal(line, &req); err != nil || req.ID == "" {
		c.malformedUIRequest(line, err)
		return
	}
	if req.Method == "cancel" {
		c.handleCancel(line, c.uiCancel)
		return
	}
	req.Start, req.End = c.readStart, c.readEnd
	if !dialogMethods[req.Method] {
		return // fire-and-forget: delivered as an event only
	}
	c.mu.Lock()
	if c.exitErr != nil || c.closed {
		c.mu.Unlock()
		return
	}
	ctx, cancel := context.WithCancel(context.Background())
	if req.Timeout > 0 {
		// The agent resolves a timed dialog itself; stop asking then.
		ctx, cancel = context.WithTimeout(context.Background(), time.Duration(req.Timeout)*time.Millisecond)
	}
	c.uiCancel[req.ID] = cancel
	c.mu.Unlock()

	handler := c.opts.UI
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		defer cancel()
		resp := Cancelled()
		if handler != nil {
			resp = c.callUI(ctx, handler, &req)
		}
		c.mu.Lock()
		_, live := c.uiCancel[req.ID]
		delete(c.uiCancel, req.ID)
		c.mu.Unlock()
		if !live || errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return // withdrawn (omp's cancel) or timed out: the agent moved on
		}
		// Otherwise the answer goes out, even one given as Close began;
		// after the transport ended, send refuses it.
		frame := map[string]any{"type": "extension_ui_response", "id": req.ID}
		switch {
		case resp.value != nil:
			frame["value"] = *resp.value
		case resp.confirmed != nil:
			frame["confirmed"] = *resp.confirmed
		default:
			frame["cancelled"] = true
		}
		if err := c.send(frame); err != nil && c.Err() == nil {
			c.log.Warn("rpc: could not answer a UI dialog", "method", req.Method, "err", err)
		}
	}()
}

func (c *Client) callUI(ctx context.Context, h UIHandler, req *UIRequest) (resp UIResponse) {
	defer func() {
		if v := recover(); v != nil {
			c.log.Error("rpc: UI handler panicked; dialog cancelled", "method", req.Method)
			resp = Cancelled()
		}
	}()
	return h(ctx, req)
}

// malformedUIRequest reports a UI request that does not decode and, when
// its id can be read and it may be a dialog, answers it cancelled: the
// agent would otherwise wait forever for an answer nobody will give.
func (c *Client) malformedUIRequest(line []byte, err error) {
	if err == nil {
		err = errors.New("no id")
	}
	var head struct {
		ID     json.RawMessage `json:"id"`
		Method json.RawMessage `json:"method"`
	}
	_ = json.Unmarshal(line, &head)
	var id, method string
	idOK := json.Unmarshal(head.ID, &id) == nil && id != ""
	methodOK := json.Unmarshal(head.Method, &method) == nil
	answer := idOK && (dialogMethods[method] || !methodOK)
	if answer {
		err = fmt.Errorf("malformed request, answered cancelled: %v", err)
	} else {
		err = fmt.Errorf("malformed request: %v", err)
	}
	c.reportError(&ProtocolError{Op: "extension_ui_request", Err: err})
	if !answer {
		return
	}
	c.mu.Lock()
	ended := c.exitErr != nil || c.closed
	c.mu.Unlock()
	if !ended {
		c.queueReply(map[string]any{"type": "extension_ui_response", "id": id, "cancelled": true}, "cancellation of a malformed UI dialog")
	}
}
