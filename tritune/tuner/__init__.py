"""The tuner: the tuning loop, flat here (`task`, `tuner`, `measurer`, `builder`, `prior`,
`breakdown`, `run`, and `timing`, the one timing authority); the GPU worker (`worker/`); devices,
spreading and the cluster (`gpus/`); whole models (`model/`); the shipped recordings and their
format (`recordings/`); and the CLI with its display (`cli/`)."""
