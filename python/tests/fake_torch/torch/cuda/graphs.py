"""torch.cuda.graphs' shape: torch.cuda.graph enters a capture through CUDAGraph.capture_begin."""

captures = []


class CUDAGraph:
    def capture_begin(self, pool=None, capture_error_mode="global"):
        captures.append(self)

    def capture_end(self):
        pass


class graph:
    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode="global"):
        self.cuda_graph = cuda_graph

    def __enter__(self):
        self.cuda_graph.capture_begin()

    def __exit__(self, *exc):
        self.cuda_graph.capture_end()
