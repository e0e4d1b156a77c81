package room

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// A message sent with an idempotency key (Message.Key) is accepted once
// per room incarnation: its id is derived from the room and the key, so
// the store that keeps the message keeps the key with it (across a
// restart), and a second submit with the key finds the first message and
// answers its acceptance instead of accepting another. In a cluster the
// id goes with the message into the room's inbox, where JetStream takes
// an id once (within its duplicate window) and the holder accepts an id
// once (Accept); a front end that finds the message already accepted
// answers it without forwarding. A purge deletes the room's messages, so
// a key may be used again in the room's next incarnation.

// MaxKeyBytes bounds an idempotency key.
const MaxKeyBytes = 255

// ErrKeyReused is returned (wrapped, with the reason) by Submit for an
// idempotency key the room's incarnation already accepted with another
// message: another text, sender or delivery.
var ErrKeyReused = errors.New("room: idempotency key reused for another message")

// checkKey says what is wrong with an idempotency key.
func checkKey(key string) error {
	if len(key) > MaxKeyBytes || strings.ContainsFunc(key, func(c rune) bool { return c < 0x20 || c > 0x7e }) {
		return fmt.Errorf("%w: an idempotency key must be 1 to %d printable ASCII characters", ErrBadMessage, MaxKeyBytes)
	}
	return nil
}

// keyID is the id of the room's message sent with key: the same for the
// same room and key, and shaped as every message id.
func keyID(room, key string) string {
	sum := sha256.Sum256([]byte("agenthost message\x00" + room + "\x00" + key))
	return "m_" + hex.EncodeToString(sum[:9])
}

// lockKey waits until no other submit of key runs in the room, and
// returns the function that lets the next one go; the caller is inside
// the room's door.
func (r *roomState) lockKey(ctx context.Context, key string) (func(), error) {
	for {
		r.mu.Lock()
		busy := r.keys[key]
		if busy == nil {
			if r.keys == nil {
				r.keys = map[string]chan struct{}{}
			}
			done := make(chan struct{})
			r.keys[key] = done
			r.mu.Unlock()
			return func() {
				r.mu.Lock()
				delete(r.keys, key)
				r.mu.Unlock()
				close(done)
			}, nil
		}
		r.mu.Unlock()
		select {
		case <-busy:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// accepted returns the acceptance of message id, sent with msg's key, if
// the room has it (ok): ErrKeyReused when it is another message.
func (m *Manager) accepted(ctx context.Context, room, id string, msg Message) (acc Accepted, ok bool, err error) {
	x, err := m.message(ctx, room, id)
	if errors.Is(err, ErrNotFound) {
		return Accepted{}, false, nil
	}
	if err != nil {
		return Accepted{}, false, err
	}
	var diff []string
	if x.Text != msg.Text {
		diff = append(diff, "text")
	}
	if x.Sender != msg.Sender {
		diff = append(diff, "sender")
	}
	if x.Delivery != msg.Delivery {
		diff = append(diff, "delivery")
	}
	if diff != nil {
		return Accepted{}, false, fmt.Errorf("%w: message %s (seq %d) was accepted with this key and another %s; use a new key for a new message",
			ErrKeyReused, x.ID, x.Seq, strings.Join(diff, ", "))
	}
	return Accepted{ID: x.ID, Seq: x.Seq}, true, nil
}
