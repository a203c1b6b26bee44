"""A varied set of JSON schemas for structured outputs, as the Pydantic models a client passes to
`client.beta.chat.completions.parse(response_format=Model)`, each with one valid instance: nested objects,
arrays (bounded and not), enums and literals, numbers and integers with bounds, optional and nullable
fields, unions, strings with patterns and lengths, and dictionaries. Used by the structured-output tests and
by benchmarks/grammar_libraries.py (which library compiles and masks them, and how fast)."""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, Field


class Color(StrEnum):
    RED = "red"
    GREEN = "green"
    BLUE = "blue"


class Person(BaseModel):
    name: str
    age: int


class Point(BaseModel):
    x: float
    y: float


class Address(BaseModel):
    street: str
    city: str
    postcode: Annotated[str, Field(pattern=r"^[0-9]{5}$")]


class Customer(BaseModel):
    person: Person
    address: Address


class Polygon(BaseModel):
    name: str
    vertices: Annotated[list[Point], Field(min_length=3, max_length=6)]


class Tagged(BaseModel):
    title: str
    tags: list[str]


class Paint(BaseModel):
    color: Color
    litres: Annotated[float, Field(ge=0.5, le=20)]


class Rating(BaseModel):
    stars: Annotated[int, Field(ge=1, le=5)]
    comment: str | None = None


class Flag(BaseModel):
    enabled: bool
    reason: Literal["manual", "schedule", "alarm"]


class Measurement(BaseModel):
    sensor: str
    celsius: Annotated[float, Field(ge=-50, le=60)]
    tags: dict[str, str]


class Contact(BaseModel):
    email: Annotated[str, Field(pattern=r"^[a-z]+@[a-z]+\.[a-z]{2,3}$")]
    phone: str | None


class Username(BaseModel):
    handle: Annotated[str, Field(min_length=3, max_length=12, pattern=r"^[a-z_]+$")]


class LineItem(BaseModel):
    sku: str
    quantity: Annotated[int, Field(ge=1, le=99)]
    unit_price: Annotated[float, Field(ge=0)]


class Order(BaseModel):
    order_id: int
    items: Annotated[list[LineItem], Field(min_length=1)]
    express: bool = False


class Matrix(BaseModel):
    rows: list[list[int]]


class Step(BaseModel):
    explanation: str
    output: str


class MathReasoning(BaseModel):
    steps: list[Step]
    final_answer: str


class Cat(BaseModel):
    kind: Literal["cat"]
    lives: Annotated[int, Field(ge=0, le=9)]


class Dog(BaseModel):
    kind: Literal["dog"]
    good: bool


class Pet(BaseModel):
    pet: Cat | Dog


class Event(BaseModel):
    name: str
    day: Annotated[int, Field(ge=1, le=31)]
    month: Literal["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]
    attendees: Annotated[list[str], Field(max_length=4)]


class Inventory(BaseModel):
    counts: dict[str, Annotated[int, Field(ge=0)]]


class Employee(BaseModel):
    name: str
    manager: Person | None = None
    skills: list[Literal["python", "go", "rust", "sql"]]


class Company(BaseModel):
    name: str
    founded: Annotated[int, Field(ge=1800, le=2030)]
    employees: Annotated[list[Employee], Field(max_length=3)]


class Weather(BaseModel):
    city: str
    forecast: Literal["sunny", "cloudy", "rain", "snow"]
    high: int
    low: int
    wind_kmh: Annotated[float, Field(ge=0)] | None = None


class Translation(BaseModel):
    source_language: Literal["en", "fr", "de"]
    target_language: Literal["en", "fr", "de"]
    text: str


class Tree(BaseModel):
    value: int
    children: list[Tree] = Field(default_factory=list, max_length=2)


# Each model with one instance that fits it (valid JSON for its schema, compact).
SCHEMAS: dict[str, tuple[type[BaseModel], str]] = {
    "person": (Person, '{"name": "Ada", "age": 36}'),
    "point": (Point, '{"x": 1.5, "y": -2.25}'),
    "customer": (Customer, '{"person": {"name": "Bo", "age": 7}, "address": {"street": "Main St 1", "city": "Oslo", '
                           '"postcode": "01234"}}'),
    "polygon": (Polygon, '{"name": "tri", "vertices": [{"x": 0, "y": 0}, {"x": 1, "y": 0}, {"x": 0, "y": 1}]}'),
    "tagged": (Tagged, '{"title": "Notes", "tags": ["a", "b"]}'),
    "paint": (Paint, '{"color": "green", "litres": 2.5}'),
    "rating": (Rating, '{"stars": 4, "comment": null}'),
    "flag": (Flag, '{"enabled": true, "reason": "alarm"}'),
    "measurement": (Measurement, '{"sensor": "s1", "celsius": 21.5, "tags": {"room": "lab"}}'),
    "contact": (Contact, '{"email": "ada@example.com", "phone": null}'),
    "username": (Username, '{"handle": "ada_l"}'),
    "order": (Order, '{"order_id": 12, "items": [{"sku": "X1", "quantity": 2, "unit_price": 9.99}], "express": true}'),
    "matrix": (Matrix, '{"rows": [[1, 2], [3, 4]]}'),
    "math_reasoning": (MathReasoning, '{"steps": [{"explanation": "add", "output": "4"}], "final_answer": "4"}'),
    "pet": (Pet, '{"pet": {"kind": "dog", "good": true}}'),
    "event": (Event, '{"name": "Launch", "day": 14, "month": "Mar", "attendees": ["Ann", "Bob"]}'),
    "inventory": (Inventory, '{"counts": {"apples": 3, "pears": 0}}'),
    "employee": (Employee, '{"name": "Cy", "manager": {"name": "Di", "age": 50}, "skills": ["go", "sql"]}'),
    "company": (Company, '{"name": "Acme", "founded": 1999, "employees": [{"name": "Ed", "skills": ["rust"]}]}'),
    "weather": (Weather, '{"city": "Rome", "forecast": "sunny", "high": 31, "low": 19}'),
    "translation": (Translation, '{"source_language": "en", "target_language": "fr", "text": "bonjour"}'),
    "tree": (Tree, '{"value": 1, "children": [{"value": 2, "children": []}]}'),
}
