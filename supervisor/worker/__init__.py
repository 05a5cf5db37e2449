"""A worker child: claim one task, run its handler outside any transaction, save the result."""
