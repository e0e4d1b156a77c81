// Package deptest holds the test that enforces which packages may import
// what (the layout's arrows); it has no code of its own.
package deptest
