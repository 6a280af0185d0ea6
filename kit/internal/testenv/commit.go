package testenv

import (
	"fmt"
	"strconv"
	"time"
)

// GroupCommitEnv chooses how the integration tests commit: unset, the
// programs' defaults; "1", a transaction per message; N > 1, group commit of
// up to N messages. CI runs the suite both ways.
const GroupCommitEnv = "TEST_GROUP_COMMIT_MAX"

// groupCommitWait is the batch wait the tests use with group commit.
const groupCommitWait = 5 * time.Millisecond

// GroupCommit returns the group commit the tests run with: max 0 means the
// runtime's default.
func GroupCommit() (max int, wait time.Duration) {
	n, err := strconv.Atoi(getenv(GroupCommitEnv, "0"))
	if err != nil || n < 0 {
		panic(fmt.Sprintf("%s=%q: want a number of messages", GroupCommitEnv, getenv(GroupCommitEnv, "")))
	}
	if n > 1 {
		wait = groupCommitWait
	}
	return n, wait
}

// GroupCommitVars is GroupCommit as the payment service's environment.
func GroupCommitVars() []string {
	n, wait := GroupCommit()
	if n == 0 {
		return nil
	}
	return []string{fmt.Sprintf("GROUP_COMMIT_MAX=%d", n), "GROUP_COMMIT_WAIT=" + wait.String()}
}
