"""The shop: search with filters and sort, product pages, a cart and a checkout.

Every form uses GET so that what a person submits is a plain URL; action URLs answer with a
303 redirect to a result page, so reloading or going back never repeats them.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .sitekit import Request, Response, SiteBase, esc, options_html, redirect

SORTS = [
    ("relevance", "Relevance"),
    ("price_asc", "Price: low to high"),
    ("price_desc", "Price: high to low"),
    ("rating_desc", "Customer rating"),
    ("reviews_desc", "Most reviewed"),
]
FILTERS = ("q", "category", "brand", "colour", "size", "min_price", "max_price", "min_rating")


def money(x: float) -> str:
    return f"${x:,.2f}"


def _float(text: str) -> float | None:
    try:
        return float(text.replace("$", "").replace(",", ""))
    except ValueError:
        return None


class Shop(SiteBase):
    name = "Orchard Shop"
    colour = "#b3541e"

    def __init__(self, data_dir: Path) -> None:
        self.data: dict[str, Any] = json.loads((data_dir / "shop.json").read_text())
        self.products: dict[str, dict[str, Any]] = {p["id"]: p for p in self.data["products"]}
        self.reset()

    def reset(self) -> None:
        self.cart: list[dict[str, Any]] = []
        self.orders: list[dict[str, Any]] = []
        self.searches: list[dict[str, Any]] = []
        self.viewed: list[str] = []

    def state(self) -> dict[str, Any]:
        return copy.deepcopy(
            {
                "cart": self.cart,
                "orders": self.orders,
                "searches": self.searches,
                "last_search": self.searches[-1] if self.searches else None,
                "viewed": self.viewed,
            }
        )

    # ------------------------------------------------------------------ routing

    def handle(self, req: Request) -> Response:
        path = req.path.rstrip("/") or "/"
        if path == "/":
            return self.home(req)
        if path == "/search":
            return self.search(req)
        if path.startswith("/product/"):
            return self.product(req, path.removeprefix("/product/"))
        routes = {
            "/cart": self.cart_page,
            "/cart/add": self.cart_add,
            "/cart/update": self.cart_update,
            "/cart/remove": self.cart_remove,
            "/checkout": self.checkout,
            "/checkout/place": self.place,
            "/orders": self.orders_page,
        }
        if path in routes:
            return routes[path](req)
        if path.startswith("/order/"):
            return self.order_page(req, path.removeprefix("/order/"))
        return self.error(req, 404, "Page not found.")

    def nav(self) -> list[tuple[str, str]]:
        n = sum(line["qty"] for line in self.cart)
        return [("All products", "/search"), (f"Cart ({n})", "/cart"), ("Orders", "/orders")]

    # ------------------------------------------------------------------ browsing

    def home(self, req: Request) -> Response:
        cats = "".join(
            f'<a class="button light" href="{esc(req.url("/search", category=key))}">'
            f"{esc(label)}</a>"
            for key, label in self.data["categories"].items()
        )
        top = sorted(self.products.values(), key=lambda p: (-p["rating"], p["id"]))[:5]
        body = (
            '<div class="panel"><h1>Welcome to Orchard Shop</h1>'
            f"<h2>Shop by category</h2><p>{cats}</p></div>"
            f'<div class="panel"><h2>Top rated</h2>{self.cards(req, top)}</div>'
        )
        return self.render(req, "Home", body)

    def matches(self, p: dict[str, Any], f: dict[str, str]) -> bool:
        words = f["q"].lower().split()
        text = " ".join([p["name"], p["brand"], p["category"], p["description"]]).lower()
        text += " " + self.data["categories"][p["category"]].lower()
        # A spec counts as a feature unless it says the product lacks it ("Noise cancelling: no").
        specs = [f"{k} {v}" for k, v in p["specs"].items() if v not in ("no", "none")]
        text += " " + " ".join(specs).lower()
        if any(w not in text for w in words):
            return False
        if f["category"] and p["category"] != f["category"]:
            return False
        if f["brand"] and p["brand"].lower() != f["brand"].lower():
            return False
        if f["colour"] and f["colour"].lower() not in p["colours"]:
            return False
        if f["size"] and f["size"].upper() not in [s.upper() for s in p["sizes"]]:
            return False
        lo, hi, stars = _float(f["min_price"]), _float(f["max_price"]), _float(f["min_rating"])
        if lo is not None and p["price"] < lo:
            return False
        if hi is not None and p["price"] > hi:
            return False
        return not (stars is not None and p["rating"] < stars)

    def search(self, req: Request) -> Response:
        f = {k: req.get(k) for k in FILTERS}
        sort = req.get("sort") or "relevance"
        if sort not in dict(SORTS):
            sort = "relevance"
        found = [p for p in self.products.values() if self.matches(p, f)]
        keys = {
            "price_asc": lambda p: (p["price"], p["id"]),
            "price_desc": lambda p: (-p["price"], p["id"]),
            "rating_desc": lambda p: (-p["rating"], p["id"]),
            "reviews_desc": lambda p: (-p["reviews"], p["id"]),
            "relevance": lambda p: p["id"],
        }
        found.sort(key=keys[sort])
        self.searches.append({**{k: v for k, v in f.items() if v}, "sort": sort})
        del self.searches[:-50]
        prods = list(self.products.values())
        cats = list(self.data["categories"].items())
        brands = sorted({p["brand"] for p in prods})
        colours = sorted({c for p in prods for c in p["colours"]})
        sizes = sorted({s for p in prods for s in p["sizes"] if s.isdigit()}, key=int)
        sizes += [s for s in ("XS", "S", "M", "L", "XL", "XXL")]
        ratings = [("4.5", "4.5 stars & up"), ("4", "4 stars & up"), ("3.5", "3.5 stars & up")]
        pairs = [(x, x) for x in brands]
        sidebar = (
            f'<form class="panel side" action="{esc(req.url("/search"))}" method="get">'
            "<h2>Filters</h2>"
            '<label for="f-q">Keywords</label>'
            '<input type="text" id="f-q" aria-label="Keywords" name="q"'
            f' value="{esc(f["q"])}">'
            '<label for="f-cat">Category</label>'
            '<select id="f-cat" aria-label="Category" name="category">'
            f"{options_html(cats, f['category'], 'Any category')}</select>"
            '<label for="f-brand">Brand</label>'
            '<select id="f-brand" aria-label="Brand" name="brand">'
            f"{options_html(pairs, f['brand'], 'Any brand')}</select>"
            '<label for="f-colour">Colour</label>'
            '<select id="f-colour" aria-label="Colour" name="colour">'
            f"{options_html([(c, c) for c in colours], f['colour'], 'Any colour')}</select>"
            f'<label for="f-size">Size</label><select id="f-size" aria-label="Size" name="size">'
            f"{options_html([(s, s) for s in sizes], f['size'], 'Any size')}</select>"
            '<label for="f-min">Min price ($)</label>'
            '<input type="number" id="f-min" aria-label="Min price ($)"'
            f' name="min_price" step="0.01" value="{esc(f["min_price"])}">'
            '<label for="f-max">Max price ($)</label>'
            '<input type="number" id="f-max" aria-label="Max price ($)"'
            f' name="max_price" step="0.01" value="{esc(f["max_price"])}">'
            '<label for="f-rating">Rating</label>'
            '<select id="f-rating" aria-label="Rating" name="min_rating">'
            f"{options_html(ratings, f['min_rating'], 'Any rating')}</select>"
            '<label for="f-sort">Sort by</label>'
            '<select id="f-sort" aria-label="Sort by" name="sort">'
            f"{options_html(SORTS, sort)}</select>"
            '<button type="submit">Apply filters</button>'
            f'<a class="button light" href="{esc(req.url("/search"))}">Clear</a></form>'
        )
        results = (
            f'<div class="panel grow"><h1>{len(found)} result{"s" if len(found) != 1 else ""}'
            f"</h1>{self.cards(req, found)}</div>"
        )
        body = f'<div class="layout">{sidebar}{results}</div>'
        return self.render(req, "Search", body, query=f["q"])

    def cards(self, req: Request, products: list[dict[str, Any]]) -> str:
        if not products:
            return "<p>No products match. Try removing a filter.</p>"
        rows = "".join(
            "<tr>"
            f'<td><a href="{esc(req.url("/product/" + p["id"]))}"><b>{esc(p["name"])}</b></a>'
            f'<br><span class="muted">{esc(p["brand"])} &middot; '
            f"{esc(self.data['categories'][p['category']])}</span></td>"
            f'<td class="price">{money(p["price"])}</td>'
            f'<td><span class="stars">&#9733; {p["rating"]:.1f}</span>'
            f' <span class="muted">({p["reviews"]} reviews)</span></td>'
            f"<td>{esc(', '.join(p['colours']))}</td>"
            "</tr>"
            for p in products
        )
        return (
            "<table><tr><th>Product</th><th>Price</th><th>Rating</th><th>Colours</th></tr>"
            f"{rows}</table>"
        )

    def product(self, req: Request, pid: str) -> Response:
        p = self.products.get(pid)
        if p is None:
            return self.error(req, 404, f"No product {pid!r}.")
        self.viewed.append(pid)
        del self.viewed[:-50]
        specs = "".join(
            f"<tr><th>{esc(k)}</th><td>{esc(v)}</td></tr>" for k, v in p["specs"].items()
        )
        colour = (
            '<label for="colour">Colour</label>'
            '<select id="colour" aria-label="Colour" name="colour">'
            f"{options_html([(c, c) for c in p['colours']], p['colours'][0])}</select>"
        )
        size = ""
        if p["sizes"]:
            size = (
                '<label for="size">Size</label><select id="size" aria-label="Size" name="size">'
                f"{options_html([(s, s) for s in p['sizes']], '', 'Choose a size')}</select>"
            )
        body = (
            '<div class="layout"><div class="panel grow">'
            f'<h1>{esc(p["name"])}</h1><p class="muted">Brand: <b>{esc(p["brand"])}</b>'
            f" &middot; Category: {esc(self.data['categories'][p['category']])}"
            f" &middot; Item {esc(p['id'])}</p>"
            f'<p class="price">{money(p["price"])}</p>'
            f'<p><span class="stars">&#9733; {p["rating"]:.1f} out of 5</span>'
            f' <span class="muted">({p["reviews"]} reviews)</span></p>'
            f"<p>{esc(p['description'])}</p>"
            f"<h2>Specifications</h2><table>{specs}"
            f"<tr><th>Colours</th><td>{esc(', '.join(p['colours']))}</td></tr>"
            f"<tr><th>Sizes</th><td>{esc(', '.join(p['sizes']) or 'one size')}</td></tr>"
            "</table></div>"
            f'<form class="panel side" action="{esc(req.url("/cart/add"))}" method="get">'
            f'<input type="hidden" name="product" value="{esc(pid)}">'
            f"{colour}{size}"
            '<label for="qty">Quantity</label>'
            '<input type="number" id="qty" aria-label="Quantity"'
            ' name="qty" value="1" min="1" max="20">'
            '<button type="submit">Add to cart</button></form></div>'
        )
        return self.render(req, p["name"], body)

    # ------------------------------------------------------------------ cart

    def cart_add(self, req: Request) -> Response:
        p = self.products.get(req.get("product"))
        if p is None:
            return self.error(req, 404, "That product does not exist.")
        try:
            qty = int(req.get("qty") or "1")
        except ValueError:
            return self.error(req, 400, "The quantity must be a whole number.")
        if not 1 <= qty <= 20:
            return self.error(req, 400, "The quantity must be between 1 and 20.")
        options: dict[str, str] = {}
        colour = req.get("colour").lower() or p["colours"][0]
        if colour not in p["colours"]:
            return self.error(req, 400, f"{p['name']} is not sold in {colour}.")
        options["colour"] = colour
        if p["sizes"]:
            size = req.get("size")
            if not size:
                return self.error(req, 400, "Please choose a size.")
            if size.upper() not in [s.upper() for s in p["sizes"]]:
                return self.error(req, 400, f"{p['name']} is not sold in size {size}.")
            options["size"] = next(s for s in p["sizes"] if s.upper() == size.upper())
        for line in self.cart:
            if line["product_id"] == p["id"] and line["options"] == options:
                line["qty"] = min(20, line["qty"] + qty)
                break
        else:
            self.cart.append(
                {
                    "product_id": p["id"],
                    "name": p["name"],
                    "qty": qty,
                    "options": options,
                    "price": p["price"],
                }
            )
        return redirect(req.url("/cart", added=p["id"]))

    def _line(self, req: Request) -> int | None:
        try:
            i = int(req.get("line"))
        except ValueError:
            return None
        return i if 0 <= i < len(self.cart) else None

    def cart_update(self, req: Request) -> Response:
        i = self._line(req)
        try:
            qty = int(req.get("qty"))
        except ValueError:
            qty = -1
        if i is None or not 0 <= qty <= 20:
            return self.error(req, 400, "Choose a cart line and a quantity from 0 to 20.")
        if qty == 0:
            del self.cart[i]
        else:
            self.cart[i]["qty"] = qty
        return redirect(req.url("/cart"))

    def cart_remove(self, req: Request) -> Response:
        i = self._line(req)
        if i is None:
            return self.error(req, 400, "No such cart line.")
        del self.cart[i]
        return redirect(req.url("/cart"))

    def subtotal(self) -> float:
        return round(sum(float(line["price"]) * int(line["qty"]) for line in self.cart), 2)

    def cart_page(self, req: Request) -> Response:
        notice = ""
        added = self.products.get(req.get("added"))
        if added:
            notice = f'<div class="notice">Added {esc(added["name"])} to your cart.</div>'
        if not self.cart:
            body = f'{notice}<div class="panel"><h1>Your cart is empty</h1></div>'
            return self.render(req, "Cart", body)
        rows = ""
        for i, line in enumerate(self.cart):
            opts = ", ".join(f"{k}: {v}" for k, v in line["options"].items())
            rows += (
                f'<tr><td><a href="{esc(req.url("/product/" + line["product_id"]))}">'
                f"{esc(line['name'])}</a><br><span class=muted>{esc(opts)}</span></td>"
                f"<td>{money(line['price'])}</td><td>"
                f'<form action="{esc(req.url("/cart/update"))}" method="get">'
                f'<input type="hidden" name="line" value="{i}">'
                f'<input type="number" name="qty" value="{line["qty"]}" min="0" max="20"'
                f' aria-label="Quantity of {esc(line["name"])}" style="width:80px">'
                '<button type="submit" class="light">Update</button></form></td>'
                f"<td>{money(line['price'] * line['qty'])}</td>"
                f'<td><a class="button danger" href="{esc(req.url("/cart/remove", line=i))}">'
                "Remove</a></td></tr>"
            )
        body = (
            f'{notice}<div class="panel"><h1>Your cart</h1><table>'
            "<tr><th>Item</th><th>Price</th><th>Quantity</th><th>Total</th><th></th></tr>"
            f"{rows}</table><p class=price>Subtotal: {money(self.subtotal())}</p>"
            f'<a class="button" href="{esc(req.url("/checkout"))}">Proceed to checkout</a>'
            "</div>"
        )
        return self.render(req, "Cart", body)

    # ------------------------------------------------------------------ checkout

    def checkout(self, req: Request) -> Response:
        if not self.cart:
            return self.error(req, 400, "Your cart is empty.")
        ship = self.data["shipping"]
        radios = "".join(
            f'<label style="font-weight:normal"><input type="radio" name="shipping"'
            f' value="{esc(k)}"{" checked" if k == "standard" else ""}> {esc(v["label"])}:'
            f" {money(v['price'])}"
            + (f" (free over {money(v['free_over'])})" if v["free_over"] else "")
            + "</label>"
            for k, v in ship.items()
        )
        items = "".join(f"<li>{line['qty']} &times; {esc(line['name'])}</li>" for line in self.cart)

        def field(name: str, label: str) -> str:
            return (
                f'<label for="c-{name}">{label}</label>'
                f'<input type="text" id="c-{name}" name="{name}" aria-label="{label}">'
            )

        body = (
            '<div class="layout"><form class="panel grow" method="get"'
            f' action="{esc(req.url("/checkout/place"))}"><h1>Checkout</h1>'
            f"{field('name', 'Full name')}{field('address', 'Street address')}"
            f"{field('city', 'City')}{field('zip', 'Postcode')}"
            f"<label>Shipping method</label>{radios}"
            f"{field('coupon', 'Coupon code (optional)')}"
            '<button type="submit">Place order</button></form>'
            f'<div class="panel side"><h2>Order summary</h2><ul>{items}</ul>'
            f"<p>Subtotal: <b>{money(self.subtotal())}</b></p></div></div>"
        )
        return self.render(req, "Checkout", body)

    def place(self, req: Request) -> Response:
        if not self.cart:
            return self.error(req, 400, "Your cart is empty.")
        ship = {k: req.get(k) for k in ("name", "address", "city", "zip")}
        missing = [k for k, v in ship.items() if not v]
        if missing:
            return self.error(req, 400, "Please fill in: " + ", ".join(missing) + ".")
        method = req.get("shipping") or "standard"
        rule = self.data["shipping"].get(method)
        if rule is None:
            return self.error(req, 400, f"Unknown shipping method {method!r}.")
        coupon = req.get("coupon").upper()
        percent = 0
        if coupon:
            if coupon not in self.data["coupons"]:
                return self.error(req, 400, f"The coupon code {coupon} is not valid.")
            percent = self.data["coupons"][coupon]
        subtotal = self.subtotal()
        discount = round(subtotal * percent / 100, 2)
        free = rule["free_over"] is not None and subtotal - discount >= rule["free_over"]
        cost = 0.0 if free else rule["price"]
        order: dict[str, Any] = {
            "id": f"O-{1001 + len(self.orders)}",
            "items": [copy.deepcopy(line) for line in self.cart],
            "shipping": {**ship, "method": method},
            "coupon": coupon or None,
            "subtotal": subtotal,
            "discount": discount,
            "shipping_cost": cost,
            "total": round(subtotal - discount + cost, 2),
        }
        self.orders.append(order)
        self.cart = []
        return redirect(req.url("/order/" + order["id"], placed=1))

    def order_page(self, req: Request, oid: str) -> Response:
        order = next((o for o in self.orders if o["id"] == oid), None)
        if order is None:
            return self.error(req, 404, f"No order {oid!r}.")
        notice = '<div class="notice">Thank you! Your order was placed.</div>'
        items = "".join(
            f"<tr><td>{esc(i['name'])}</td><td>"
            f"{esc(', '.join(f'{k}: {v}' for k, v in i['options'].items()))}</td>"
            f"<td>{i['qty']}</td><td>{money(i['price'] * i['qty'])}</td></tr>"
            for i in order["items"]
        )
        s = order["shipping"]
        body = (
            f'{notice if req.get("placed") else ""}<div class="panel">'
            f"<h1>Order {esc(order['id'])}</h1><table>"
            f"<tr><th>Item</th><th>Options</th><th>Qty</th><th>Total</th></tr>{items}</table>"
            f"<p>Ship to: {esc(s['name'])}, {esc(s['address'])}, {esc(s['city'])}"
            f" {esc(s['zip'])} &middot; {esc(s['method'])} shipping</p>"
            f"<p>Subtotal {money(order['subtotal'])} &middot; discount"
            f" {money(order['discount'])} &middot; shipping {money(order['shipping_cost'])}</p>"
            f"<p class=price>Total: {money(order['total'])}</p></div>"
        )
        return self.render(req, f"Order {order['id']}", body)

    def orders_page(self, req: Request) -> Response:
        rows = "".join(
            f'<tr><td><a href="{esc(req.url("/order/" + o["id"]))}">{esc(o["id"])}</a></td>'
            f"<td>{sum(i['qty'] for i in o['items'])} items</td><td>{money(o['total'])}</td></tr>"
            for o in self.orders
        )
        body = '<div class="panel"><h1>Your orders</h1>' + (
            f"<table>{rows}</table>" if rows else "<p>No orders yet.</p>"
        )
        return self.render(req, "Orders", body + "</div>")
