"""matplotlib's backend in codebox sandboxes (MPLBACKEND=module://codebox_mpl): Agg, and
figures shown like a notebook shows them. `plt.show()` saves every open figure as PNG
under /workspace/out and closes it; boot.py does the same at the end of a run with the
figures still open (`capture`), except those the program saved itself. The supervisor
returns /workspace/out's files with the result (images as image content).
"""

import posix

from matplotlib._pylab_helpers import Gcf
from matplotlib.backend_bases import FigureManagerBase
from matplotlib.backends.backend_agg import FigureCanvasAgg

OUT_DIR = "/workspace/out"


def _next_free(number):
    """`/workspace/out/figure-<n>.png` for the first n >= number not taken."""
    n = number
    while True:
        path = "%s/figure-%d.png" % (OUT_DIR, n)
        try:
            posix.lstat(path)
        except FileNotFoundError:
            return path
        n += 1


def capture(shown=True):
    """Saves the open figures that have axes as PNG under /workspace/out and closes them;
    `shown=False` (the end of a run) leaves out figures the program saved itself. Returns
    the paths written."""
    written = []
    for manager in list(Gcf.get_all_fig_managers()):
        figure = manager.canvas.figure
        if figure.axes and (shown or not getattr(figure, "_codebox_saved", False)):
            try:
                posix.mkdir(OUT_DIR, 0o755)
            except FileExistsError:
                pass
            path = _next_free(manager.num)
            figure.savefig(path, format="png")
            written.append(path)
        Gcf.destroy(manager)
    return written


class FigureManager(FigureManagerBase):
    @classmethod
    def pyplot_show(cls, *, block=None):
        capture(shown=True)


class FigureCanvas(FigureCanvasAgg):
    manager_class = FigureManager

    def print_figure(self, *args, **kwargs):
        # The program saved this figure (savefig): the end of the run does not add it.
        self.figure._codebox_saved = True
        return super().print_figure(*args, **kwargs)
