package local

// CountOps makes l call op on every store operation.
func (l *Locker) CountOps(op func()) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.op = op
}
