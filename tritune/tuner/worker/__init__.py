"""The GPU worker: the runner contract (`protocol`), the local runner and its crash-isolated worker
process (`local`), what the worker does with a candidate (`candidate`), how failures are classified
(`failures`), and the lifeline that ends a child when its parent ends (`lifeline`)."""
