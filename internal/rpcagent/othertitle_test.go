package rpcagent

import "testing"

// omp's follow-up to "Other (type your own)" is asked as the question, not
// as omp's terminal picker.
func TestOMPOtherTitle(t *testing.T) {
	for in, want := range map[string]string{
		"Which color?\n\n○ red\n○ blue\n◉ Other (type your own)\n\nEnter your response:": "Which color? (your own answer)",
		"Which color?":  "Which color?",
		"Pick one\n○ a": "Pick one\n○ a", // no chosen line: not omp's follow-up
	} {
		if got := ompOtherTitle(in); got != want {
			t.Errorf("ompOtherTitle(%q) = %q, want %q", in, got, want)
		}
	}
}
