"""pytest -p fixed: every captured step at its largest shape (max_running rows, the widest tables)."""
import engine.model.cuda_graphs as graphs

graphs.bucket = lambda n, most: most
