"""Browser tests: JupyterLab and the export in headless Chromium."""

# Issue 58's review sizes: a laptop (1366x768) and a desktop (1920x1080). A test that must read
# right on a laptop sets this on its page (page.set_viewport_size(LAPTOP)).
LAPTOP = {"width": 1366, "height": 768}


def attach_cell(server, name: str = "live") -> str:
    """The attach notebook's first cell: follow the test server's feed and show the Dashboard."""
    return ("from explorer import Session, Dashboard\n"
            f"{name} = Session.attach({server.feed!r}, snapshot_address={server.snapshots!r})\n"
            f"{name}.follow()\n"
            f"Dashboard({name})")
