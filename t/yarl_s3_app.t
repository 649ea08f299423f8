#!/usr/bin/perl

# The article's S3 setup end to end, against a real root: nginx checks the bucket's read
# quota and counts nothing (yarl_check only); the S3 application (examples/s3-app, with
# yarl-tower) accounts each handler's quota, whose parent is that bucket quota. A listing's
# cost, charged by the application after its response, reaches nginx through the root,
# and nginx rejects the bucket's reads before they reach the application.

use warnings;
use strict;

use FindBin;
use lib "$FindBin::Bin/lib";
use Test::More;
use Test::Yarl qw(http_get http_request status_of header_of body_of);
use JSON::PP ();

my $t = Test::Yarl->new();
$t->run_root('A');
# The bucket's read quota barely drains (0.001/s): every fill below is an exact sum. Up to
# 4 units pass, from 5 everything is rejected. (Not a hard cutoff at 5: a root keeps a
# counter at most 0.25 s of its limit above high_burst, the rest of a large claim parked,
# and with low_burst = high_burst that leaves the others' checks a sliver above the cutoff.)
$t->put_quota('s3_bkt_read', 0.001, 4, 5);
$t->put_quota('s3_bkt_get', 1000, 1000, 1000, 's3_bkt_read');
$t->put_quota('s3_bkt_list', 1000, 1000, 1000, 's3_bkt_read');
$t->put_quota('s3_bkt_write', 1000, 1000, 1000);
$t->put_quota('s3_bkt_put', 1000, 1000, 1000, 's3_bkt_write');
$t->run_app(8081, 'A');

$t->write_http_conf(<<'EOF', workers => 2, events => 'worker_connections 64;');
    yarl_roots %%ROOT_A%%;
    yarl_sync_interval 200ms;

    map $uri $bucket {
        ~^/(?<b>[a-z0-9][a-z0-9.-]*)(/|$)  $b;
        default                            "";
    }
    map $request_method $type {
        GET      read;
        HEAD     read;
        default  write;
    }
    log_format yarl escape=json '{"uri":"$request_uri","status":$status,'
        '"yarl_status":"$yarl_status","yarl_quota":"$yarl_quota"}';

    server {
        listen 127.0.0.1:%%PORT_8080%%;
        access_log %%TESTDIR%%/nginx.json yarl;

        location / {
            # No yarl_account, no yarl_charge: nginx counts nothing.
            yarl_check s3_${bucket}_${type};
            add_header X-Yarl-Status $yarl_status always;
            proxy_pass http://127.0.0.1:%%PORT_8081%%;
        }

        location = /stats {
            yarl_stats;
        }
    }
EOF

$t->run();
my $p = $t->port(8080);
my $app = $t->port(8081);
sub app_quota {
	my ($name) = @_;
	return ($t->stats($app, "/_yarl/status?quota=$name") // {})->{quota};
}
sub root_fill {
	my ($name) = @_;
	my (undef, $q) = $t->admin('GET', "/v1/quotas/$name");
	return ref $q ? $q->{counter}{fill} : undef;
}
ok($t->wait_for(sub {
	($t->stats($p, '/stats?quota=s3_bkt_read')->{quota} // {})->{limit}
		&& (app_quota('s3_bkt_list') // {})->{parent}
}, 10), 'nginx and the application hold the quotas');

is(status_of(http_request('PUT', $p, '/bkt', {}, '')), 200, 'bucket created through nginx');
my @puts = map { status_of(http_request('PUT', $p, sprintf('/bkt/k%02d', $_), {}, "object $_")) } 1 .. 20;
is_deeply(\@puts, [(200) x 20], '20 objects stored');

# Three GETs: nginx checks s3_bkt_read (and passes), the application accounts s3_bkt_get,
# whose parent is s3_bkt_read.
for my $i (1 .. 3) {
	my $r = http_get($p, "/bkt/k0$i");
	is(status_of($r), 200, "GET $i passes");
	is(header_of($r, 'X-Yarl-Status'), 'PASSED', "GET $i: nginx checked s3_bkt_read");
}
ok($t->wait_for(sub { abs((root_fill('s3_bkt_read') // 0) - 3) < 0.01 }, 5),
	'the root holds 3 units: the application accounted 3 GETs, nginx, which passed all '
	. 'three, added nothing (it would be 6)')
	or diag('root fill ' . (root_fill('s3_bkt_read') // 'none'));
ok($t->wait_for(sub {
	abs((($t->stats($p, '/stats?quota=s3_bkt_read')->{quota} // {})->{fill} // 0) - 3) < 0.01
}, 5), 'nginx sees those 3 units through the root');

# One listing of 20 objects: accounted 1 up front, charged 20 after the response.
my $r = http_get($p, '/bkt');
is(status_of($r), 200, 'LIST passes (fill 3 <= 4)');
my $listing = JSON::PP->new->decode(body_of($r));
is(scalar @{$listing->{keys}}, 20, 'the listing returned 20 objects');
my $q = app_quota('s3_bkt_read');
cmp_ok(abs($q->{fill} - 24), '<', 0.01,
	"the application charged the listing 1 + 20: 3 + 21 = 24 on the bucket quota ($q->{fill})");

# nginx learns it at its next sync after the application's: it rejects the bucket's reads.
my $rej;
ok($t->wait_for(sub {
	$rej = http_get($p, '/bkt/k01');
	(header_of($rej, 'X-Yarl-Status') // '') eq 'REJECTED';
}, 5), 'nginx rejects the bucket once the listing cost reached it');
is(status_of($rej), 429, 'with 429');
cmp_ok(header_of($rej, 'Retry-After') // 0, '>=', 1, 'and Retry-After');
cmp_ok(root_fill('s3_bkt_read'), '>=', 5, 'the bucket quota is at its burst at the root');

my $seen = () = $t->app_log(8081);
my @after = map { http_get($p, sprintf('/bkt/k%02d', $_)) } 1 .. 10;
is_deeply([map { status_of($_) } @after], [(429) x 10], 'every read of the bucket is refused');
is_deeply([map { header_of($_, 'X-Yarl-Status') } @after], [('REJECTED') x 10],
	'by nginx');
is(scalar(() = $t->app_log(8081)), $seen, 'none of them reached the application');
is(status_of(http_get($p, '/bkt')), 429, 'listings too');
is(status_of(http_request('PUT', $p, '/bkt/new', {}, 'x')), 200, 'writes go on');

# What reached the application: the 3 GETs, the listing and the reads nginx let through
# before it knew (the application refused those itself: its own count was at 24).
my @app = $t->app_log(8081);
is(scalar(grep { $_->{method} eq 'GET' && $_->{path} =~ m{^/bkt/k} && $_->{status} == 200 } @app),
	3, 'the application served 3 GETs');
ok(!grep({ $_->{method} eq 'GET' && $_->{path} =~ m{^/bkt/k} && $_->{status} != 200
	&& $_->{status} != 429 } @app), 'and refused the others with 429');

$t->finish();

my @log = map { JSON::PP->new->decode($_) } grep { /\S/ } split /\n/, $t->read_file('nginx.json');
my @rejected = grep { $_->{yarl_status} eq 'REJECTED' } @log;
cmp_ok(scalar @rejected, '>=', 11, 'nginx logged its rejections');
ok(!grep({ $_->{yarl_quota} ne 's3_bkt_read' } @rejected), 'all by s3_bkt_read');
done_testing();
